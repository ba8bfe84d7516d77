#!/usr/bin/env bash
# A fill job by hand under Slurm: one array task per shard, requeued when preempted.
#   MANIFEST=/shared/data/manifest.jsonl OUT=/shared/data/clean CKPT=/shared/ckpt/clean \
#     sbatch --export=ALL slurm-fill.sh
# slurm.conf needs JobRequeue=1 (or --requeue below), RequeueExit=99 and, for the --signal
# warning at preemption, SlurmctldParameters=preempt_send_user_signal. `ttsfleet slurm
# render-sbatch` writes the agent's version of this script.
#SBATCH --job-name=ttsfleet-fill
#SBATCH --partition=fill
#SBATCH --gres=gpu:1
#SBATCH --array=0-7
#SBATCH --requeue
#SBATCH --signal=B:USR1@30
#SBATCH --open-mode=append
#SBATCH --output=ttsfleet-fill-%A_%a.log
set -uo pipefail
# Traps first: a preemption can come at any instant, also in the ~0.15 s before the fill job has
# installed its own handlers (an `exec`ed Python would then die of the signal: exit 138, FAILED,
# never requeued). The fill job runs in the background, the stop signal is forwarded to it, and
# a child killed by the forwarded signal before it could handle it still exits 99: its
# checkpoint is consistent at any instant, so Slurm requeues it (RequeueExit=99) and it resumes.
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
echo "ttsfleet-fill array=${SLURM_ARRAY_JOB_ID:-none} task=${SLURM_ARRAY_TASK_ID:-none} restart=${SLURM_RESTART_COUNT:-0}" >&2
if [[ -n $stop_signal ]]; then
  echo "ttsfleet-fill stopped by SIG$stop_signal before starting: exit 99" >&2
  exit 99
fi
# The fill job takes its shard from SLURM_ARRAY_TASK_ID / SLURM_ARRAY_TASK_COUNT, checkpoints on
# the signal and exits 99, which RequeueExit=99 turns into a requeue (exit 0 would end the job).
# shellcheck disable=SC2086  # FILL_ARGS is a list of extra options
${TTSFLEET:-ttsfleet} fill run --input "$MANIFEST" --output "$OUT" --checkpoint "$CKPT" ${FILL_ARGS:-} &
child=$!
if [[ -n $stop_signal ]]; then kill -s "$stop_signal" "$child" 2>/dev/null || true; fi
rc=0
while :; do
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
  rc=99  # killed by the forwarded signal before its handler was installed: requeue and resume
fi
echo "ttsfleet-fill exit=$rc" >&2
exit "$rc"
