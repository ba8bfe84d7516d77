# ttsfleet: the slurm.conf settings preemptible fill work depends on.
#
# Rendered by `ttsfleet slurm render-conf --nodes HOSTLIST` (node list, grace time and requeue
# delay filled in). Append to a site's slurm.conf, merging with existing SlurmctldParameters /
# AuthInfo values, then check with `ttsfleet slurm validate-conf /etc/slurm/slurm.conf`. Every
# line below is one the fill job's no-work-lost guarantee rests on; the reason is above it.
#
# Priority order: training > cleaning. Both partitions cover the same nodes; a job in the higher
# PriorityTier partition preempts jobs of the lower one (preempt/partition_prio).
PreemptType=preempt/partition_prio
# Preempted jobs are requeued, never cancelled or suspended (suspension keeps GPU memory held).
PreemptMode=REQUEUE
# Allow batch jobs to be requeued at all (fill jobs also pass --requeue explicitly).
JobRequeue=1
# A fill job that checkpointed after the warning signal exits ${requeue_exit}. Exit 0 would make a preempted
# job COMPLETED and never requeued: the rest of its shard would be silently lost.
RequeueExit=${requeue_exit}
# Deliver the job's own --signal=B:USR1@<grace> at preemption time. Without this parameter the
# signal only fires <grace> seconds before the time limit and a preempted batch script gets
# nothing until GraceTime has run out.
SlurmctldParameters=${slurmctld_parameters}
# cred_expire is also how long a requeued job must wait before it may start again (Slurm's
# default is 120 s). Shorter means a preempted fill job resumes sooner on freed GPUs. Once that
# wait is over, what starts the job on an otherwise quiet cluster is the main scheduler's next
# periodic pass (SchedulerParameters=sched_interval, default 60 s): the backfill scheduler only
# runs after a job, node or partition change. Count up to cred_expire + 1 + sched_interval.
AuthInfo=${auth_info}
# GPUs are generic resources; the GPU class is the GRES type (h200, rtx5090, rtx6000pro), so a
# fill job asks for --gres=gpu:<class>:1 and lands only on that class. See gres-example.conf.
GresTypes=gpu
# Training: highest tier, never preempted itself.
PartitionName=${train_partition} Nodes=${nodes} PriorityTier=10 PreemptMode=OFF Default=NO MaxTime=INFINITE State=UP
# Fill (data cleaning): lowest tier, requeued on preemption, ${grace_period_s} s between the warning
# signal and SIGTERM/SIGKILL: the fill job checkpoints and exits ${requeue_exit} within it.
PartitionName=${fill_partition} Nodes=${nodes} PriorityTier=1 PreemptMode=REQUEUE GraceTime=${grace_period_s} Default=NO MaxTime=INFINITE State=UP
