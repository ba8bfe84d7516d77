#!/usr/bin/env bash
# A fill job by hand under Slurm: one array task per shard, requeued when preempted.
#   MANIFEST=/shared/data/manifest.jsonl OUT=/shared/data/clean CKPT=/shared/ckpt/clean \
#     sbatch --export=ALL slurm-fill.sh
# slurm.conf needs JobRequeue=1 (or --requeue below), RequeueExit=99 and, for the --signal
# warning at preemption, SlurmctldParameters=preempt_send_user_signal (`ttsfleet slurm
# render-conf` writes these lines). FILL_ARGS adds `fill run` options, TTSFLEET the command.
# Rendered by `ttsfleet slurm render-sbatch --example` from slurm/fill-job.sbatch.tpl, the
# template the fill agent's scripts come from: edit that, not this file.
#SBATCH --job-name=ttsfleet-fill
#SBATCH --partition=fill
# any GPU; name the class as the GRES type (gpu:h200:1) to pin one
#SBATCH --gres=gpu:1
#SBATCH --cpus-per-task=1
# requeue on preemption (with RequeueExit=99 also after an orderly early exit)
#SBATCH --requeue
# warning signal to this batch shell at preemption (needs SlurmctldParameters=preempt_send_user_signal);
# 30 s = the fill partition's GraceTime, after which Slurm sends SIGTERM, then SIGKILL
#SBATCH --signal=B:USR1@30
# keep the log of every run of a requeued job in one file
#SBATCH --open-mode=append
#SBATCH --output=ttsfleet-fill-%A_%a.log
# (no --comment: the fill agent's shards carry one, a hand-run array does not)
#SBATCH --array=0-7
set -u

# The wrapper. Traps first: a preemption can come at any instant, even before the fill job runs
# (an `exec`ed Python would then die of the signal: exit 138, FAILED, never requeued). bash defers
# traps while a foreground child runs, so the fill job runs in the background and `wait` is
# re-entered until it really exits; the warning signal is forwarded to it. The fill job
# checkpoints and exits 99 (PREEMPTED_REQUEUE); passing 99 on makes Slurm requeue the job
# (RequeueExit=99). Exit 0 after a preemption would mark the job COMPLETED and lose the rest of
# the shard, any other code would mark it FAILED.
child=0
stop_signal=""
forward() {
    stop_signal=$1
    if (( child > 0 )); then kill -s "$1" "$child" 2>/dev/null || true; fi
}
trap 'forward USR1' USR1
trap 'forward TERM' TERM
trap 'forward INT' INT

: "${MANIFEST:?set MANIFEST}" "${OUT:?set OUT}" "${CKPT:?set CKPT}"

# Shard: the array task id when this is a job array over shards, else the fixed index. All shards
# share the output and checkpoint directories (the fill job keeps one file set per shard there).
SHARD_INDEX=${SLURM_ARRAY_TASK_ID:-0}
SHARD_COUNT=${SLURM_ARRAY_TASK_COUNT:-1}
SHARD_TAG="shard-${SHARD_INDEX}-of-${SHARD_COUNT}"
echo "ttsfleet-fill job=${SLURM_JOB_ID:-?} ${SHARD_TAG} restart=${SLURM_RESTART_COUNT:-0} host=${SLURMD_NODENAME:-?} gpus=${CUDA_VISIBLE_DEVICES:-none} start=$(date +%s)"
if [[ -n $stop_signal ]]; then
    echo "ttsfleet-fill job=${SLURM_JOB_ID:-?} ${SHARD_TAG} stopped by SIG${stop_signal} before starting exit=99"
    exit 99
fi

# TTSFLEET_FILL_AS_STEP=1 (set by the slurmrestd v0.0.38 backend, whose API cannot ask for the
# batch-shell flag of the warning signal): run the fill job as a job step, which is what Slurm
# sends a non-batch warning signal to.
launcher=""
if [[ ${TTSFLEET_FILL_AS_STEP:-0} == 1 ]]; then
    launcher="srun --ntasks=1 --nodes=1 --kill-on-bad-exit=1 --quiet --export=ALL"
fi
# The arguments are ttsfleet.contracts.fill.fill_argv's, the same builder the operator uses.
${launcher} ${TTSFLEET:-ttsfleet} fill run \
    --input "$MANIFEST" \
    --output "$OUT" \
    --checkpoint "$CKPT" ${FILL_ARGS:-} &
child=$!
rc=0
while :; do
    # Once a stop is asked for, send it again until the job exits, 0.05 s later, then 0.1, 0.2 ...
    # up to every 2 s: a signal that reaches the forked shell in the instant before it execs the
    # job is taken by the trap it inherited and lost (seen in CI: the job then ran to the end and
    # exited 0). The job's handler only sets a flag, so repeats are harmless.
    pause=0.05
    while [[ -n $stop_signal ]] && kill -0 "$child" 2>/dev/null; do
        kill -s "$stop_signal" "$child" 2>/dev/null || true
        sleep "$pause" & wait $! 2>/dev/null
        case $pause in 0.05) pause=0.1 ;; 0.1) pause=0.2 ;; 0.2) pause=0.5 ;; 0.5) pause=1 ;; *) pause=2 ;; esac
    done
    wait "$child"; rc=$?
    (( rc > 128 )) || break
    # >128: a trapped signal interrupted `wait`; wait again while the child runs, else fetch its
    # remembered exit status (127 = already collected: rc was the child's own status)
    kill -0 "$child" 2>/dev/null && continue
    wait "$child" 2>/dev/null; again=$?
    (( again == 127 )) || rc=$again
    break
done
if [[ -n $stop_signal ]] && (( rc > 128 )); then
    # killed by the forwarded signal before its handler was installed: the checkpoint on disk is
    # consistent at any instant, so requeue and resume from it
    rc=99
fi
echo "ttsfleet-fill job=${SLURM_JOB_ID:-?} ${SHARD_TAG} exit=${rc} end=$(date +%s)"
exit "$rc"
