"""What the reference trainers (`classic`, `tf2_pss`) share: data, thread counts, the record.

Deliberately independent of `lowlevel` (the references must not inherit its fixes), but
the data are the same as `lowlevel.data.images.synthetic()`'s training split: 16,384 uint8
images of MNIST shape (784 pixels, seed 1234) whose labels are the argmax of a fixed
random linear teacher applied to the centred pixels, so the task is learnable. Models see
pixels / 255 in [0, 1], as in `lowlevel`.

Nothing here imports TensorFlow, so `tf2_pss` can set its thread counts first.
"""

from __future__ import annotations

import ipaddress
import json
import os
import socket
import time
from typing import Optional, Sequence

import numpy as np

from lowlevel.outputs import files

NUM_INPUTS = 28 * 28
NUM_CLASSES = 10


def synthetic_train(num_train: int = 16384, seed: int = 1234):
    """(images uint8 `[N, 784]`, labels int64 `[N]`): `lowlevel.data.images.synthetic()`'s train split."""
    rng = np.random.default_rng(seed)
    teacher = rng.standard_normal((NUM_INPUTS, NUM_CLASSES)).astype(np.float32)
    images = rng.integers(0, 256, size=(num_train, 28, 28, 1), dtype=np.uint8)
    images = images.reshape(num_train, NUM_INPUTS)
    centred = images.astype(np.float32) / 255.0 - 0.5
    return images, np.argmax(centred @ teacher, axis=1).astype(np.int64)


def hosts(flag_value: str) -> list:
    return [h.strip() for h in flag_value.split(",") if h.strip()] if flag_value else []


def _machine(host_port: str) -> str:
    """A name for the machine of "host:port"; loopback and this host's names map to one."""
    host = host_port.rpartition(":")[0].strip("[]") or host_port
    if host in ("localhost", socket.gethostname(), socket.getfqdn()):
        return "<local>"
    try:
        return "<local>" if ipaddress.ip_address(host).is_loopback else host
    except ValueError:
        return host


def thread_counts(training_hosts: Sequence[str], my_host: Optional[str], trains: bool = True,
                  other_hosts: Sequence[str] = ()):
    """(intra_op, inter_op) as `lowlevel.runtime.server.session_config` chooses them.

    The cores of a machine go to the training tasks on it: intra-op =
    max(1, cores // training tasks on this host); a task that does not train
    (a ps, tf2_pss's coordinator) gets 1 when training tasks share its
    machine, else its share among the other such tasks there (`other_hosts`,
    itself included). inter-op = max(2, intra-op). In-process (`my_host`
    None) the one task has every core.
    """
    cores = os.cpu_count() or 1
    if my_host is None:
        return cores, max(2, cores)
    mine = _machine(my_host)
    training_here = sum(_machine(h) == mine for h in training_hosts)
    if trains:
        share = max(1, cores // max(1, training_here))
    elif training_here:
        share = 1
    else:
        share = max(1, cores // max(1, sum(_machine(h) == mine for h in other_hosts)))
    return share, max(2, share)


def record(task: str, batch_size: int, step_secs: Sequence[float], window_secs: Optional[float],
           first_step_unix: Optional[float], last_step_unix: Optional[float], **extra) -> dict:
    """The JSON record every reference trainer writes.

    Args:
      step_secs: the wall time of each measured step (after warm-up).
      window_secs: wall time from the start of the first measured step to the end of
        the last (loop overhead included); examples/s = steps * batch / window.
      first_step_unix: when the task's very first step (warm-up included) had finished.
      last_step_unix: when its last step had finished.
    """
    n = len(step_secs)
    ms = np.asarray(step_secs, dtype=np.float64) * 1000.0
    return {
        "task": task,
        "local_steps": n,
        "examples_per_sec": (n * batch_size / window_secs) if n and window_secs else None,
        "step_ms_p50": float(np.percentile(ms, 50)) if n else None,
        "step_ms_p90": float(np.percentile(ms, 90)) if n else None,
        "first_step_unix": first_step_unix,
        "last_step_unix": last_step_unix,
        "batch_size": batch_size,
        **extra,
    }


def write_json(path: Optional[str], rec: dict) -> None:
    """Writes `rec` to `path` atomically (a poller never sees half a file); prints it too."""
    line = json.dumps(rec)
    print(line, flush=True)
    if not path:
        return
    files.write_json(path, rec, indent=None)


def wait_for_ports(host_ports: Sequence[str], timeout_secs: float = 120.0) -> None:
    """Blocks until every "host:port" accepts a TCP connection (servers still importing TF)."""
    deadline = time.monotonic() + timeout_secs
    for hp in host_ports:
        host, _, port = hp.rpartition(":")
        while True:
            try:
                socket.create_connection((host.strip("[]"), int(port)), timeout=1.0).close()
                break
            except OSError:
                if time.monotonic() > deadline:
                    raise TimeoutError(f"{hp} did not accept connections in {timeout_secs} s")
                time.sleep(0.2)


def ready_file(start_file: str, task: str) -> str:
    """The file a reference worker creates once its session is ready (with `--start_file`)."""
    return f"{start_file}.{task}.ready"


def wait_for_chief(start_file: Optional[str], is_chief: bool, poll_secs: float = 0.05) -> None:
    """With `--start_file`, a non-chief worker waits for the chief's session before its own.

    Once the chief's ready file exists the variables are initialised, so the
    worker's `MonitoredTrainingSession` is ready at once instead of after
    `SessionManager`'s 30 s recovery wait (tensorflow/tensorflow#10679); a driver
    can start every worker together and their TensorFlow imports overlap. The
    chief (worker 0) and runs without `--start_file` do not wait.
    """
    if not start_file or is_chief:
        return
    while not os.path.exists(ready_file(start_file, "worker0")):
        time.sleep(poll_secs)


def drive_coordinator(coordinator, train_step, iterator, train_steps: int, warmup: int,
                      join_every: int, num_workers: int, batch_size: int) -> dict:
    """TF2 PSS: schedules `train_steps` steps, the first `warmup` unmeasured; joins every
    `join_every` steps and times each chunk (wall ms x workers / steps in it).

    Returns the chief's figures for `record`: first_step_unix, last_unix (seconds),
    final_loss, and local_steps, examples_per_sec, step_ms_p50/p90 (ms).
    """
    coordinator.schedule(train_step, args=(iterator,))
    coordinator.join()
    first_step_unix = time.time()
    for _ in range(warmup - 1):
        coordinator.schedule(train_step, args=(iterator,))
    coordinator.join()
    remaining, chunk_ms, loss = train_steps - warmup, [], None
    window_start = last = time.time()
    while remaining > 0:
        n = min(join_every, remaining)
        for _ in range(n):
            loss = coordinator.schedule(train_step, args=(iterator,))
        coordinator.join()
        now = time.time()
        chunk_ms.append((now - last) * 1000.0 * num_workers / n)
        last, remaining = now, remaining - n
    measured = train_steps - warmup
    return dict(
        first_step_unix=first_step_unix, last_unix=last,
        final_loss=float(loss.fetch()) if loss is not None else None,
        local_steps=measured,
        examples_per_sec=measured * batch_size / (last - window_start) if measured else None,
        step_ms_p50=float(np.percentile(chunk_ms, 50)) if chunk_ms else None,
        step_ms_p90=float(np.percentile(chunk_ms, 90)) if chunk_ms else None,
        step_ms_basis="chunk wall time * num_workers / steps in the chunk")


def tf2_pss_task(flags, run_chief) -> None:
    """One task of a TF2 ParameterServerStrategy reference trainer, from its flags.

    `flags` has ps_hosts, worker_hosts, chief_host, job_name, task_index, out_json and,
    optionally, intra_op_threads / inter_op_threads (0: this machine's share). A ps or a
    worker serves until it is stopped; the chief calls `run_chief(tf, cluster_spec,
    num_workers)` and writes the record it returns to --out_json.

    Raises:
      absl.app.UsageError: a host list is missing, or --task_index is out of range.
    """
    from absl import app, logging  # noqa: PLC0415 (only the TF2 references use them)

    ps_hosts, worker_hosts = hosts(flags.ps_hosts), hosts(flags.worker_hosts)
    if not (ps_hosts and worker_hosts and flags.chief_host):
        raise app.UsageError("--ps_hosts, --worker_hosts and --chief_host are all required")
    jobs = {"ps": ps_hosts, "worker": worker_hosts, "chief": [flags.chief_host]}
    if not 0 <= flags.task_index < len(jobs[flags.job_name]):
        raise app.UsageError(f"--task_index={flags.task_index} out of range")
    me = jobs[flags.job_name][flags.task_index]
    intra, inter = thread_counts(worker_hosts, me, flags.job_name == "worker",
                                 ps_hosts + [flags.chief_host])
    intra = getattr(flags, "intra_op_threads", 0) or intra
    inter = getattr(flags, "inter_op_threads", 0) or inter
    # As the TensorFlow tutorial advises: a failed RPC reports to the caller at once.
    os.environ.setdefault("GRPC_FAIL_FAST", "use_caller")
    import tensorflow as tf  # noqa: PLC0415 (after the thread settings are known)

    tf.config.threading.set_intra_op_parallelism_threads(intra)
    tf.config.threading.set_inter_op_parallelism_threads(inter)
    cluster_spec = tf.train.ClusterSpec(jobs)
    if flags.job_name in ("ps", "worker"):
        config = tf.compat.v1.ConfigProto(intra_op_parallelism_threads=intra,
                                          inter_op_parallelism_threads=inter)
        server = tf.distribute.Server(cluster_spec, job_name=flags.job_name,
                                      task_index=flags.task_index, protocol="grpc",
                                      config=config, start=True)
        logging.info("%s %d: serving on %s; join() forever", flags.job_name,
                     flags.task_index, me)
        server.join()
        return
    rec = run_chief(tf, cluster_spec, len(worker_hosts))
    rec.update(intra_op_threads=intra, inter_op_threads=inter)
    write_json(flags.out_json, rec)
    logging.info("chief: done")
