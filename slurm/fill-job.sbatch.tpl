#!/usr/bin/env bash
# ttsfleet fill shard under Slurm, rendered by ttsfleet.slurm.sbatch (`ttsfleet slurm render-sbatch`).
# The #SBATCH lines make this file submittable on its own (`sbatch FILE`); the fill agent passes
# the same options on the command line / in the REST request.
#SBATCH --job-name=${job_name}
#SBATCH --partition=${partition}
# the GPU class is the GRES type: this shard runs only on ${gpu_class} GPUs
#SBATCH --gres=gpu:${gpu_class}:${gpus}
#SBATCH --cpus-per-task=${cpus}
# requeue on preemption (with RequeueExit=99 also after an orderly early exit)
#SBATCH --requeue
# warning signal to this batch shell at preemption (needs SlurmctldParameters=preempt_send_user_signal);
# ${grace_time_s} s = the fill partition's GraceTime, after which Slurm sends SIGTERM, then SIGKILL
#SBATCH --signal=B:USR1@${grace_time_s}
# keep the log of every run of a requeued job in one file
#SBATCH --open-mode=append
#SBATCH --output=${output}
#SBATCH --comment=${comment}
${array_directive}
set -u

# The wrapper. Traps first: a preemption can come at any instant, even before the fill job runs.
# bash defers traps while a foreground child runs, so the fill job runs in the background and
# `wait` is re-entered until it really exits; the warning signal is forwarded to it. The fill job
# checkpoints and exits 99 (PREEMPTED_REQUEUE); passing 99 on makes Slurm requeue the job
# (RequeueExit=99). Exit 0 after a preemption would mark the job COMPLETED and lose the rest of
# the shard, any other code would mark it FAILED.
child=0
stop_signal=""
forward() {
    stop_signal=$$1
    if (( child > 0 )); then kill -s "$$1" "$$child" 2>/dev/null || true; fi
}
trap 'forward USR1' USR1
trap 'forward TERM' TERM
trap 'forward INT' INT

# Shard: the array task id when this is a job array over shards, else the fixed index. All shards
# share the output and checkpoint directories (the fill job keeps one file set per shard there).
SHARD_INDEX=$${SLURM_ARRAY_TASK_ID:-${shard_index}}
SHARD_COUNT=${shard_count}
SHARD_TAG="shard-$${SHARD_INDEX}-of-$${SHARD_COUNT}"
echo "ttsfleet-fill job=$${SLURM_JOB_ID:-?} $${SHARD_TAG} restart=$${SLURM_RESTART_COUNT:-0} host=$${SLURMD_NODENAME:-?} gpus=$${CUDA_VISIBLE_DEVICES:-none} start=$$(date +%s)"
if [[ -n $$stop_signal ]]; then
    echo "ttsfleet-fill job=$${SLURM_JOB_ID:-?} $${SHARD_TAG} stopped by SIG$${stop_signal} before starting exit=99"
    exit 99
fi

# TTSFLEET_FILL_AS_STEP=1 (set by the slurmrestd v0.0.38 backend, whose API cannot ask for the
# batch-shell flag of the warning signal): run the fill job as a job step, which is what Slurm
# sends a non-batch warning signal to.
launcher=""
if [[ $${TTSFLEET_FILL_AS_STEP:-0} == 1 ]]; then
    launcher="srun --ntasks=1 --nodes=1 --kill-on-bad-exit=1 --quiet --export=ALL"
fi
$${launcher} ${fill_command} run \
    --input ${manifest} \
    --output ${output_root} \
    --checkpoint ${checkpoint_root} \
    --shard $${SHARD_INDEX}/$${SHARD_COUNT}${extra_args} &
child=$$!
if [[ -n $$stop_signal ]]; then kill -s "$$stop_signal" "$$child" 2>/dev/null || true; fi
rc=0
while :; do
    wait "$$child"; rc=$$?
    (( rc > 128 )) || break
    # >128: a trapped signal interrupted `wait`; wait again while the child runs, else fetch its
    # remembered exit status (127 = already collected: rc was the child's own status)
    kill -0 "$$child" 2>/dev/null && continue
    wait "$$child" 2>/dev/null; again=$$?
    (( again == 127 )) || rc=$$again
    break
done
if [[ -n $$stop_signal ]] && (( rc > 128 )); then
    # killed by the forwarded signal before its handler was installed: the checkpoint on disk is
    # consistent at any instant, so requeue and resume from it
    rc=99
fi
echo "ttsfleet-fill job=$${SLURM_JOB_ID:-?} $${SHARD_TAG} exit=$${rc} end=$$(date +%s)"
exit "$$rc"
