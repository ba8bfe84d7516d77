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
set -euo pipefail
: "${MANIFEST:?set MANIFEST}" "${OUT:?set OUT}" "${CKPT:?set CKPT}"
echo "ttsfleet-fill array=${SLURM_ARRAY_JOB_ID:-none} task=${SLURM_ARRAY_TASK_ID:-none} restart=${SLURM_RESTART_COUNT:-0}" >&2
# exec: the fill job replaces this shell, so the B:USR1 warning and Slurm's SIGTERM reach it
# directly. It takes its shard from SLURM_ARRAY_TASK_ID / SLURM_ARRAY_TASK_COUNT, checkpoints on
# the signal and exits 99, which RequeueExit=99 turns into a requeue (exit 0 would end the job).
# shellcheck disable=SC2086  # FILL_ARGS is a list of extra options
exec ttsfleet fill run --input "$MANIFEST" --output "$OUT" --checkpoint "$CKPT" ${FILL_ARGS:-}
