"""The job runner's limits and timings, in one frozen value with the units in the names.

Every quantity the runner handles has a bound here: how many jobs a node runs at once, how
large a command may be, how many started pod uids the ledger remembers, how large a job's log
grows and how many are kept, how long a stop waits at each step. `validate()` rejects values
that make no sense, with a message naming the field.
"""

from __future__ import annotations

from dataclasses import dataclass

from agent.units import MIB

# Linux refuses a single argument or environment string over 32 pages (MAX_ARG_STRLEN).
LINUX_ARG_BYTES_MAX = 128 * 1024


@dataclass(frozen=True, slots=True, kw_only=True)
class JobLimits:
    jobs_max: int = 256  # jobs running at once on this node
    args_max: int = 4096  # argv entries of one command
    arg_bytes_max: int = LINUX_ARG_BYTES_MAX  # one argv entry or environment value, UTF-8
    command_bytes_max: int = 1024 * 1024  # argv and binding environment together
    env_vars_max: int = 1024  # variables a binding may set
    name_bytes_max: int = 253  # pod uid and group
    started_remembered_max: int = 100_000  # pod uids the ledger keeps, most recent first
    logs_kept_max: int = 1000  # job log files kept under the state directory
    log_bytes_max: int = 16 * MIB  # a running job's log past this is cut (`agent.job_logs`)
    log_tail_bytes: int = 1 * MIB  # of a cut log, kept beside it in `<log>.prev`
    grace_s: float = 10.0  # SIGTERM to SIGKILL
    kill_wait_s: float = 5.0  # SIGKILL to giving up on the group (uninterruptible sleep)
    gpu_release_timeout_s: float = 30.0  # SIGKILL to NVML showing none of the job's pids
    gpu_poll_s: float = 0.5  # between NVML process-list reads during a stop
    group_poll_s: float = 0.05  # between /proc scans while a stopped group dies
    exit_poll_s: float = 0.5  # between liveness checks where pidfd is unavailable
    log_poll_s: float = 1.0  # between checks of the running jobs' log sizes

    def validate(self) -> JobLimits:
        counts = {"jobs_max": self.jobs_max, "args_max": self.args_max,
                  "arg_bytes_max": self.arg_bytes_max,
                  "command_bytes_max": self.command_bytes_max,
                  "env_vars_max": self.env_vars_max, "name_bytes_max": self.name_bytes_max,
                  "started_remembered_max": self.started_remembered_max,
                  "logs_kept_max": self.logs_kept_max, "log_bytes_max": self.log_bytes_max,
                  "log_tail_bytes": self.log_tail_bytes}
        for name, value in counts.items():
            if value < 1:
                raise ValueError(f"job limits: {name} must be at least 1, not {value}")
        if self.arg_bytes_max > LINUX_ARG_BYTES_MAX:
            raise ValueError(f"job limits: arg_bytes_max over {LINUX_ARG_BYTES_MAX} cannot "
                             "be passed to exec on Linux")
        if self.logs_kept_max < self.jobs_max:
            raise ValueError("job limits: logs_kept_max must cover jobs_max, or a running "
                             "job's log could be pruned")
        if self.log_tail_bytes > self.log_bytes_max:
            raise ValueError("job limits: log_tail_bytes must not exceed log_bytes_max")
        seconds = {"grace_s": self.grace_s, "kill_wait_s": self.kill_wait_s,
                   "gpu_release_timeout_s": self.gpu_release_timeout_s}
        for name, wait_s in seconds.items():
            if wait_s < 0:
                raise ValueError(f"job limits: {name} must not be negative, not {wait_s}")
        polls = {"gpu_poll_s": self.gpu_poll_s, "group_poll_s": self.group_poll_s,
                 "exit_poll_s": self.exit_poll_s, "log_poll_s": self.log_poll_s}
        for name, poll_s in polls.items():
            if poll_s <= 0:
                raise ValueError(f"job limits: {name} must be positive, not {poll_s}")
        return self
