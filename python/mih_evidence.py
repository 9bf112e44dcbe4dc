"""mih_evidence: the evidence contract (docs/evidence.md, mih-evidence version 1) written from a
PyTorch training loop, so that `mih validate` and `mih compare` judge a run of your own trainer
against its 1-rank run. torch only; installed as share/mih/python/mih_evidence.py.

A loop calls the hooks of mih's validation session at the same points (every rank calls every
hook: some are collectives over the group):

    ev = mih_evidence.Session("runs/ddp2/mymodel/DpReplicate2", model, case="DpReplicate2",
                              compare_to="Reference", config={"dp_replicate": 2})
    ev.attach_optimizer(optimizer)
    for step in range(steps):
        ev.begin_step(step)
        for mb, (rows, batch) in enumerate(micro_batches):    # batch: {"input_ids": ..., "labels": ...}
            ev.record_batch(step, mb, rows, batch)              # rows: its global rows (or the first)
            ...forward, backward...
        ev.after_backward_before_clip(step)                         # the gradients, synchronized
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        ev.after_clip(step, norm)
        optimizer.step()
        ev.after_optimizer(step)
        ev.end_step(step, loss=global_loss, lr=lr)                  # the loss over the global batch
    ev.finish()

What it writes, under the case directory (rank 0; every value global, gathered over the group):
environment.json (the contract's stamp, writer "mih-evidence.py <version> (python)", the case),
config.resolved.json, check/structure.json (the parameter table: FQN, global and local shape,
placement per axis: Replicate() under DDP; the optimizer's sharding under
ZeroRedundancyOptimizer), check/parameter_watchlist.json, data/input_identity.jsonl (SHA-256 of
every field of the global batch, assembled from every rank's rows), cases/runtime/metrics.jsonl
(loss, grad norms, lr, input hash, the bytes DDP's communication hook moved),
cases/runtime/performance_rank<r>.jsonl, cases/runtime/replicas_step<k>.json (every rank's SHA-256 of
every parameter after the optimizer), probes/rank0.jsonl (every parameter before the first
step, its gradient before and after clipping, after the optimizer: sum, sum of squares, min,
max, the random-projection sketch of mih's probes, values of small tensors; and every module's
forward output and the gradient of the global loss with respect to it per step, by forward and
tensor hooks, in global row coordinates; `loss_scale` says what each rank's backpropagated loss
is over its share of the global loss: the world size under DDP by default).

Placements are recorded where the framework exposes them: a DistributedDataParallel module's
parameters are Replicate() over "dp_replicate"; ZeroRedundancyOptimizer shards the optimizer
state, not the parameters. torch.distributed collectives are ledgered where they can be
observed: DDP's gradient all-reduce through `Session.ddp_comm_hook` (register it with
`ddp_model.register_comm_hook(None, ev.ddp_comm_hook)`). FSDP in Python is untested here
(Debian's python3-torch 1.13 cannot import it on Python 3.11).
"""
import errno
import fcntl
import hashlib
import json
import numbers
import os
import secrets
import socket
import stat
import time

import torch
import torch.distributed as dist

VERSION = "0.3.0"
CONTRACT = {"contract": "mih-evidence", "version": 1}
VALUES_UP_TO = 64  # tensors of at most this many elements also record their values (float64)
PROJECTIONS = 4    # the sketch's random +-1 projections (mih's WatchlistOptions::projections)
_MASK = (1 << 31) - 1
# In the case directory: flock'ed by its one writer for the writer's life (mih's C++
# TrainerSession takes the same file, so the two exclude each other too); it names the holder.
WRITER_LOCK = ".writer.lock"


def projection_signs(index, j):
    """The +-1 sign of sketch projection j for global element indices `index` (int64): the hash
    mih's probes use (harness/parallel/activations.cpp projection_signs), so a tensor's sketch
    is the same whatever the sharding and whichever writer computed it."""
    h = ((index & _MASK) * 1540483477 + (j * 668265263 + 374761393)) & _MASK
    h = h ^ (h >> 15)
    h = (h * 739982445) & _MASK
    h = h ^ (h >> 13)
    return ((h & 1) * 2 - 1).to(torch.float64)


def tensor_statistics(x, first_index=0, total_numel=None, index=None):
    """Sharding-invariant statistics of x (any shape), whose element i is global element
    first_index + i (or index[i] when `index`, an int64 tensor of x.numel() global element
    indices, is given: rows of the global batch that are not contiguous): sum, sum_sq, min, max,
    nonfinite, numel, sketch; values when small and whole. Returns the partial statistics of
    this piece (add them over the pieces)."""
    x = x.detach().to(torch.float64).reshape(-1).cpu()
    finite = torch.isfinite(x)
    xf = torch.where(finite, x, torch.zeros_like(x))
    if index is None:
        index = torch.arange(first_index, first_index + x.numel(), dtype=torch.int64)
    elif index.numel() != x.numel():
        raise ValueError(f"tensor_statistics: index has {index.numel()} elements, the tensor {x.numel()}")
    elif not bool((index == torch.arange(index.numel(), dtype=torch.int64)).all()):
        first_index = -1  # not the whole tensor in order: no values
    sketch = [float((xf * projection_signs(index, j)).sum()) for j in range(PROJECTIONS)]
    out = {"sum": float(xf.sum()), "sum_sq": float((xf * xf).sum()), "nonfinite": int((~finite).sum()),
           "numel": int(x.numel()), "sketch": sketch}
    if x.numel():
        out["min"] = float(x.min())
        out["max"] = float(x.max())
    if (total_numel if total_numel is not None else x.numel()) <= VALUES_UP_TO and first_index == 0:
        out["values"] = [v if v == v and abs(v) != float("inf") else None for v in x.tolist()]
    return out


def _hash_rows(t):
    t = t.detach().contiguous().cpu()
    return hashlib.sha256(t.numpy().tobytes()).hexdigest()


def sampler_rows(rank, world, first, count):
    """The global rows of `count` consecutive samples of a DistributedSampler's share, from
    the rank's sample `first` of the step on: rank r of W takes positions r, r + W, r + 2 W, ...
    of the global batch (shuffled or not: the sampler shuffles the whole index list once, the
    same on every rank, then strides it). E.g. rank 1 of 2, micro-batch 1 of 2 with 2 rows
    each: sampler_rows(1, 2, 2, 2) == [5, 7]."""
    for name, value in (("rank", rank), ("world", world), ("first", first), ("count", count)):
        if isinstance(value, bool) or not isinstance(value, numbers.Integral):
            raise ValueError(f"sampler_rows: {name} must be an int, got {value!r}")
    if not (world >= 1 and 0 <= rank < world and first >= 0 and count >= 0):
        raise ValueError(f"sampler_rows: needs 0 <= rank < world, first >= 0 and count >= 0; got rank {rank}, "
                         f"world {world}, first {first}, count {count}")
    return [int(rank) + int(world) * (int(first) + i) for i in range(int(count))]


def _row_index(rows, batch):
    """record_batch's rows as an int64 tensor [b] of global rows, checked against the batch."""
    sizes = {field: (t.shape[0] if t.dim() else None) for field, t in batch.items()}
    b = next(iter(sizes.values()), 0)
    if any(size != b for size in sizes.values()):
        raise ValueError(f"record_batch: every field needs the same number of rows (dim 0), got {sizes}")
    if isinstance(rows, bool) or not (isinstance(rows, (numbers.Integral, list, tuple, range, torch.Tensor)) or
                                      hasattr(rows, "__array__")):
        raise ValueError(f"record_batch: rows is the first global row (an int) or one global row per row of the "
                         f"batch (a sequence of ints), got {type(rows).__name__}")
    if getattr(rows, "ndim", None) == 0:  # a 0-d numpy array or tensor: its one value
        rows = rows.item()
    if isinstance(rows, numbers.Integral) and not 0 <= int(rows) < 2 ** 62:
        raise ValueError(f"record_batch: the first global row must be in [0, 2^62), got {int(rows)}")
    if isinstance(rows, numbers.Integral):
        index = torch.arange(int(rows), int(rows) + (b or 0), dtype=torch.int64)
    else:
        if not isinstance(rows, torch.Tensor):  # a list, a range, a numpy array of ints
            values = rows.tolist() if hasattr(rows, "tolist") else list(rows)
            if not all(isinstance(v, numbers.Integral) and not isinstance(v, bool) for v in values):
                raise ValueError(f"record_batch: rows must be integers, got {values[:4]}")
            if not all(0 <= int(v) < 2 ** 62 for v in values):
                raise ValueError(f"record_batch: global rows must be in [0, 2^62), got {[int(v) for v in values][:4]}")
            rows = torch.tensor([int(v) for v in values], dtype=torch.int64)
        if rows.dim() != 1:
            raise ValueError(f"record_batch: rows must be one row index per row (1-d), got shape {list(rows.shape)}")
        index = rows
        if index.dtype not in (torch.int64, torch.int32, torch.int16, torch.int8, torch.uint8):
            raise ValueError(f"record_batch: rows must be integers, got {index.dtype}")
        index = index.to(torch.int64)
        if index.numel() != b:
            raise ValueError(f"record_batch: rows names {index.numel()} global rows, the batch holds {b} "
                             f"(one row index per row of every field)")
    if index.numel() and int(index.min()) < 0:
        raise ValueError(f"record_batch: global rows start at 0, got {int(index.min())}")
    if torch.unique(index).numel() != index.numel():
        raise ValueError("record_batch: a global row is named twice in one micro-batch")
    return index


def _make_own_directory(path):
    """Creates `path` component by component, refusing a link or a directory another user owns,
    or one every user can write without the sticky bit: what another user planted there would
    send the evidence elsewhere (issue 53). Raises PermissionError naming the component."""
    at = os.path.sep
    for part in os.path.abspath(path).split(os.path.sep):
        if not part:
            continue
        at = os.path.join(at, part)
        try:
            os.mkdir(at)
        except FileExistsError:
            pass
        st = os.lstat(at)
        if stat.S_ISLNK(st.st_mode) and st.st_uid not in (os.geteuid(), 0):
            raise PermissionError(f"mih_evidence: {at} is a symbolic link of uid {st.st_uid}, which would send the "
                                  f"evidence elsewhere; remove it, or write to another directory")
        _check_own_directory(os.stat(at), at)


def _check_own_directory(st, at):
    """Raises PermissionError, naming directory `at` (its stat `st`) and the fix, unless it is this
    user's or root's and no other user may write it, sticky (/tmp) excepted."""
    if st.st_uid not in (os.geteuid(), 0):
        raise PermissionError(f"mih_evidence: {at} belongs to uid {st.st_uid}, who could plant links or FIFOs "
                              f"in it; remove it, or write to a directory of yours")
    if st.st_mode & stat.S_IWOTH and not st.st_mode & stat.S_ISVTX:
        raise PermissionError(f"mih_evidence: {at} is writable by every user (mode {st.st_mode & 0o7777:04o}, no "
                              f"sticky bit); chmod o-w {at}, or write to another directory")


def _open_at(dir_fd, name, path, flags, kind):
    """os.open(name, flags | O_NOFOLLOW, dir_fd=dir_fd), its error naming `path` and what is
    there when it is not `kind` (a link, a FIFO without a reader)."""
    try:
        return os.open(name, flags | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dir_fd)
    except OSError as e:
        mode = os.lstat(name, dir_fd=dir_fd).st_mode if os.path.lexists(path) else 0
        what = ("it is a symbolic link, never followed" if stat.S_ISLNK(mode) else "it is a FIFO, not a regular file"
                if stat.S_ISFIFO(mode) else e.strerror)
        raise OSError(e.errno, f"mih_evidence: {path} is not {kind} of this writer's: {what}; remove it, or "
                               f"write to a new case directory") from None


def _lock_case_directory(path):
    """Takes `path`'s writer lock (WRITER_LOCK, opened O_NOFOLLOW, a file of this user's) and
    returns its descriptor, which holds it until closed (finish() or the process's exit).
    Raises BlockingIOError naming the directory and the holder while another writer has it."""
    lock = os.path.join(path, WRITER_LOCK)
    try:
        fd = os.open(lock, os.O_RDWR | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    except OSError as e:
        raise OSError(e.errno, f"mih_evidence: cannot open the writer lock {lock}: {e.strerror} (a link there is "
                               f"never followed); write to a new case directory") from None
    try:
        if os.fstat(fd).st_uid != os.geteuid():
            raise PermissionError(f"mih_evidence: {lock} belongs to uid {os.fstat(fd).st_uid}, not to this user: "
                                  f"write to a new case directory")
        fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        holder = os.pread(fd, 512, 0).decode("utf-8", "replace").strip() or "another process"
        os.close(fd)
        raise BlockingIOError(errno.EWOULDBLOCK, f"mih_evidence: {path} is being written by {holder!r} ({lock} is "
                                                 f"locked): one writer per case directory; wait for it to end, or "
                                                 f"write to another directory") from None
    except BaseException:
        os.close(fd)
        raise
    return fd


def _held_by(path):
    """'; being written now by <holder>' while another writer holds `path`'s lock, else ''
    (the lock file is never created here)."""
    try:
        fd = os.open(os.path.join(path, WRITER_LOCK), os.O_RDONLY | os.O_NOFOLLOW | os.O_CLOEXEC)
    except OSError:
        return ""
    try:
        fcntl.flock(fd, fcntl.LOCK_SH | fcntl.LOCK_NB)
        return ""
    except BlockingIOError:
        return f"; being written now by {os.pread(fd, 512, 0).decode('utf-8', 'replace').strip()!r}"
    finally:
        os.close(fd)


def _name_holder(fd):
    os.ftruncate(fd, 0)
    os.pwrite(fd, f"mih-evidence.py pid {os.getpid()} on {socket.gethostname()}\n".encode(), 0)


class Session:
    """The hooks of a validation session for a PyTorch loop; see the module's docstring.

    case_dir: the case directory (<root>/<spec>/<case>); it must not hold a run already.
    model: the module being trained (a DistributedDataParallel wrapper is unwrapped for names).
    case, compare_to: this case's name and the case it must equal (its 1-rank run), or "".
    config: the parallel degrees ({"dp_replicate": 2}); the others are 1.
    group: the process group of the data-parallel ranks (default: the world; None when
      torch.distributed is not initialized).
    Raises FileExistsError when case_dir holds a run's evidence (nothing is overwritten), and
    BlockingIOError, naming the holder, while another writer (this module or mih's C++
    TrainerSession) writes there: rank 0 holds the directory's WRITER_LOCK until finish().
    """

    def __init__(self, case_dir, model, case, compare_to="", config=None, group=None, dtype=None, steps=None,
                 loss_scale=None):
        self.dir = case_dir
        self.distributed = dist.is_available() and dist.is_initialized()
        self.group = group if group is not None else (dist.group.WORLD if self.distributed else None)
        self.rank = dist.get_rank(self.group) if self.distributed else 0
        self.world = dist.get_world_size(self.group) if self.distributed else 1
        self.model = model.module if hasattr(model, "module") else model
        self.ddp = hasattr(model, "module") and isinstance(model, torch.nn.parallel.DistributedDataParallel)
        # What the loss each rank backpropagates is, over its share of the global batch's loss:
        # under DDP (which averages the ranks' gradients) the world size, so that the averaged
        # gradient is the global loss's.
        if loss_scale is None and self.world > 1 and not self.ddp:
            raise ValueError("mih_evidence.Session: on %d ranks pass the DistributedDataParallel module (its gradients are "
                             "averaged, so each rank's loss carries the world size) or loss_scale=<what each rank's "
                             "backpropagated loss is over its share of the global loss>" % self.world)
        self.loss_scale = float(loss_scale if loss_scale is not None else (self.world if self.ddp else 1))
        self.optimizer = None
        self.step_rows = {}
        self.comm = {}
        self.step_start = None
        self.activations = {}
        self.output_grads = {}
        self.order = []
        self.row_index = None
        self.rows = 0
        params = list(self.model.named_parameters())
        if dtype is None:
            dtype = str(params[0][1].dtype).replace("torch.", "") if params else "float32"
        degrees = {"pp": 1, "dp_replicate": 1, "dp_shard": 1, "cp": 1, "tp": 1, "ep": 1}
        degrees.update(config or {})
        self.config = dict(degrees, cp_layout="contiguous", sequence_parallel=False, activation_checkpointing=False,
                           micro_batches=1, vpp=1, pp_schedule="1f1b", noise_twin=False, dtype=dtype, seed=0,
                           name=case)
        self.case = {"name": case, "kind": "reference" if not compare_to else "train",
                     "group": "reference" if not compare_to else "axis", "config": self.config,
                     "steps": int(steps or 0), "compare_to": compare_to, "device": "cpu",
                     "pg_backend": dist.get_backend(self.group) if self.distributed else "gloo",
                     "world_size": self.world}
        self.lock = None
        if self.rank == 0:
            self._check_free()
            _make_own_directory(case_dir)
            # Looked at again under the lock: two writers could both have found it free.
            self.lock = _lock_case_directory(case_dir)
            try:
                self._check_free()
            except BaseException:
                os.close(self.lock)
                raise
            _name_holder(self.lock)
            self._write("environment.json", {
                "evidence_contract": dict(CONTRACT, writer=f"mih-evidence.py {VERSION} (python)"),
                "case": self.case, "world_size": self.world,
                "versions": {"torch": torch.__version__, "mih_evidence": VERSION}})
            self._write("config.resolved.json", self.config)
            total = sum(p.numel() for _, p in params)
            self._write("check/parameter_watchlist.json",
                        [{"fqn": n, "global_shape": list(p.shape), "reason": f"whole model ({total} elements)"}
                         for n, p in params])
        self._hook_modules()
        self._probe("model_before", 0, {n: p for n, p in params})

    # ---- files --------------------------------------------------------------------------
    def _check_free(self):
        if os.path.exists(os.path.join(self.dir, "environment.json")):
            raise FileExistsError(f"{self.dir} holds a run's evidence already{_held_by(self.dir)}; write each run "
                                  f"to a new directory")

    def _enter(self, relative_dir):
        """A descriptor of subdirectory `relative_dir` of the case directory, made and entered a component
        at a time, never through a link, each checked (issue 53: a planted link `check` was followed)."""
        at = os.path.abspath(self.dir)
        if not os.path.isdir(at):  # a rank other than 0 (rank 0 made it)
            _make_own_directory(at)
        fd = os.open(at, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
        try:
            _check_own_directory(os.fstat(fd), at)
            for part in [p for p in relative_dir.split("/") if p]:
                at = os.path.join(at, part)
                try:
                    os.mkdir(part, 0o755, dir_fd=fd)
                except FileExistsError:
                    pass
                sub = _open_at(fd, part, at, os.O_RDONLY | os.O_DIRECTORY, "a directory")
                os.close(fd)
                fd = sub
                _check_own_directory(os.fstat(fd), at)
        except BaseException:
            os.close(fd)
            raise
        return fd

    def _write(self, relative, value):
        head, name = os.path.split(relative)
        dfd = self._enter(head)
        # A new file under a name nobody can guess, never through a link (issue 53); os.replace replaces a link.
        tmp = f"{name}.tmp.{os.getpid()}.{secrets.token_hex(8)}"
        try:
            fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644, dir_fd=dfd)
            try:
                with os.fdopen(fd, "w") as f:
                    json.dump(value, f, indent=2, allow_nan=False)
                    f.write("\n")
                os.replace(tmp, name, src_dir_fd=dfd, dst_dir_fd=dfd)
            except BaseException:
                os.unlink(tmp, dir_fd=dfd)
                raise
        finally:
            os.close(dfd)

    def _append(self, relative, value):
        head, name = os.path.split(relative)
        dfd = self._enter(head)
        path = os.path.join(os.path.abspath(self.dir), relative)
        try:
            # O_NONBLOCK: a FIFO planted there is refused below, never waited on (issue 53).
            fd = _open_at(dfd, name, path, os.O_WRONLY | os.O_CREAT | os.O_APPEND | os.O_NONBLOCK, "a regular file")
        finally:
            os.close(dfd)
        with os.fdopen(fd, "a") as f:
            st = os.fstat(fd)
            why = ("it is a FIFO, not a regular file" if stat.S_ISFIFO(st.st_mode) else
                   "it is not a regular file" if not stat.S_ISREG(st.st_mode) else
                   f"it belongs to uid {st.st_uid}, not to this user" if st.st_uid != os.geteuid() else
                   f"it has {st.st_nlink} hard links" if st.st_nlink != 1 else "")
            if why:  # a second name: another user may have hard-linked it (fs.protected_hardlinks 0)
                raise PermissionError(f"mih_evidence: cannot append to {path}: {why}, so another user could read "
                                      f"or redirect the evidence; remove it, or write to a new case directory")
            fcntl.fcntl(fd, fcntl.F_SETFL, fcntl.fcntl(fd, fcntl.F_GETFL) & ~os.O_NONBLOCK)
            f.write(json.dumps(value, allow_nan=False, separators=(",", ":")) + "\n")

    # ---- collectives -------------------------------------------------------------------
    def _sum(self, values):
        """Sums a list of floats over the group (float64)."""
        t = torch.tensor(values, dtype=torch.float64)
        if self.distributed and self.world > 1:
            dist.all_reduce(t, group=self.group)
        return t.tolist()

    def _gather_objects(self, obj):
        if not (self.distributed and self.world > 1):
            return [obj]
        out = [None] * self.world
        dist.all_gather_object(out, obj, group=self.group)
        return out

    # ---- probes ------------------------------------------------------------------------
    def _probe(self, stage, step, tensors):
        """Statistics of full tensors every rank holds whole (DDP's parameters and, after its
        all-reduce, gradients): rank 0's copy, so each element is counted once."""
        out = {}
        for name, t in tensors.items():
            if t is None:
                out[name] = {"defined_ranks": 0, "nonfinite": 0, "numel": 0, "sum": 0.0, "sum_sq": 0.0,
                             "sketch": [0.0] * PROJECTIONS}
                continue
            s = tensor_statistics(t, 0, t.numel())
            s["defined_ranks"] = self.world
            out[name] = s
        if self.rank == 0:
            self._append("probes/rank0.jsonl", {"stage": stage, "step": step, "tensors": out})

    def _hook_modules(self):
        for name, module in self.model.named_modules():
            if name:
                module.register_forward_hook(self._forward_hook(name))

    @staticmethod
    def _accumulate(table, name, s):
        acc = table.setdefault(name, {"sum": 0.0, "sum_sq": 0.0, "nonfinite": 0, "numel": 0,
                                      "sketch": [0.0] * PROJECTIONS})
        for k in ("sum", "sum_sq", "nonfinite", "numel"):
            acc[k] += s[k]
        acc["sketch"] = [a + b for a, b in zip(acc["sketch"], s["sketch"])]

    def _forward_hook(self, name):
        def hook(module, inputs, output):
            if not isinstance(output, torch.Tensor) or not self.model.training or not torch.is_grad_enabled():
                return
            if name not in self.order:
                self.order.append(name)  # the order forwards complete in: a module after its children
            # Rows of the global batch: [B_global, ...]; this rank's rows are row_index.
            index = self._element_index(output)
            self._accumulate(self.activations, name, tensor_statistics(output, index=index))
            if output.requires_grad:
                # The gradient of the global loss with respect to the output: what this rank
                # backpropagates, divided by the factor its loss carries (loss_scale).
                output.register_hook(lambda g: self._accumulate(
                    self.output_grads, name, tensor_statistics(g / self.loss_scale, index=index)))
        return hook

    def _element_index(self, output):
        """The global element index of every element of a module output [b, ...] whose rows
        are this micro-batch's rows (row_index): row g's elements are g * per_row + [0, per_row).
        An output whose dim 0 is not the micro-batch's rows is placed as if its rows were
        contiguous from the first recorded row (the writer's 0.2 behaviour)."""
        per_row = output[0].numel() if output.dim() > 0 and output.shape[0] else 0
        rows = self.row_index
        if rows is None or output.dim() == 0 or output.shape[0] != rows.numel():
            first = int(rows[0]) if rows is not None and rows.numel() else 0
            return torch.arange(first * per_row, first * per_row + output.numel(), dtype=torch.int64)
        return (rows.reshape(-1, 1) * per_row + torch.arange(per_row, dtype=torch.int64)).reshape(-1)

    # ---- DDP's communication, ledgered ---------------------------------------------------
    def ddp_comm_hook(self, state, bucket):
        """A DDP communication hook that all-reduces (average) as DDP does and ledgers the
        bytes: register with ddp_model.register_comm_hook(None, session.ddp_comm_hook)."""
        buffer = bucket.buffer()
        site = self.comm.setdefault("dp_replicate", {}).setdefault("ddp.all_reduce", 0)
        self.comm["dp_replicate"]["ddp.all_reduce"] = site + buffer.numel() * buffer.element_size()
        buffer.div_(self.world)
        fut = dist.all_reduce(buffer, group=self.group, async_op=True).get_future()
        return fut.then(lambda f: f.value()[0])

    # ---- the hooks -----------------------------------------------------------------------
    def attach_optimizer(self, optimizer):
        """After the model and optimizer are built: the parameter table (placements per axis)."""
        self.optimizer = optimizer
        zero = type(optimizer).__name__ == "ZeroRedundancyOptimizer"
        rows = []
        for n, p in self.model.named_parameters():
            placements = {"dp_replicate": "Replicate()" if self.world > 1 else "Replicate()"}
            row = {"fqn": n, "global_shape": list(p.shape), "local_shape": list(p.shape),
                   "dtype": str(p.dtype).replace("torch.", ""), "requires_grad": p.requires_grad,
                   "placements": placements, "gradient_kind": "DENSE",
                   "grad_domain": ["dp_replicate"] if self.world > 1 else []}
            if zero:
                row["optimizer_state"] = "sharded over dp_replicate (ZeroRedundancyOptimizer)"
            rows.append(row)
        if self.rank == 0:
            self._write("check/structure.json", {"parameters": rows})

    def begin_step(self, step):
        self.step_start = time.monotonic()
        self.step_rows = {}
        self.activations = {}
        self.output_grads = {}
        self.comm = {}

    def record_batch(self, step, micro_batch, rows, batch):
        """Per micro-batch, before its forward: which rows of the global batch this rank's
        micro-batch holds, and their fields. batch: {field: tensor [b, ...]}.

        rows: an int, the global row of the micro-batch's first row when its b rows are
          contiguous (rank r of W with b rows each: r * b); or a sequence (or int64 tensor) of
          b global row indices, one per row, in the order of the batch: what a
          DistributedSampler gives (rank r of W takes positions r, r + W, r + 2 W, ...: see
          `sampler_rows`). Global rows are positions in the step's global batch as the 1-rank
          run orders it, so the input identity and the activation sketches of any split equal
          the 1-rank run's.
        Raises ValueError when rows is neither, is negative, repeats a row, or does not give
        one row per row of every field."""
        index = _row_index(rows, batch)
        self.row_index = index
        for field, t in batch.items():
            self.step_rows.setdefault(field, []).append((index, t.detach().cpu()))

    def after_backward_before_clip(self, step):
        self._input_identity(step)
        self._probe("grad_before_clip", step, {n: p.grad for n, p in self.model.named_parameters()})
        # The forward outputs of the step and their gradients, summed over the ranks (collective).
        for stage, table in (("forward_output", self.activations), ("output_grad", self.output_grads)):
            names = [n for n in self.order if n in table]
            flat = []
            for n in names:
                a = table[n]
                flat += [a["sum"], a["sum_sq"], a["nonfinite"], a["numel"]] + a["sketch"]
            flat = self._sum(flat) if names else []
            tensors = {}
            for i, n in enumerate(names):
                v = flat[i * (4 + PROJECTIONS):(i + 1) * (4 + PROJECTIONS)]
                tensors[n] = {"sum": v[0], "sum_sq": v[1], "nonfinite": int(v[2]), "numel": int(v[3]),
                              "sketch": v[4:]}
            if self.rank == 0 and names:
                self._append("probes/rank0.jsonl", {"stage": stage, "step": step, "order": names, "tensors": tensors})

    def _input_identity(self, step):
        gathered = self._gather_objects(self.step_rows)
        fields = {}
        for rows in gathered:
            for field, pieces in rows.items():
                fields.setdefault(field, []).extend(pieces)
        hashes, total = {}, 0
        for field, pieces in sorted(fields.items()):
            # Every rank's rows in global row order (a row recorded twice stays twice: the
            # hash then differs from the 1-rank run's, and InputIdentity says so).
            index = torch.cat([i for i, _ in pieces], 0)
            if index.numel() and int(index.max()) >= index.numel():
                # Rows beyond the global batch: the ranks' rows do not tile it (a bookkeeping
                # error of the loop's `rows`, which InputIdentity would not see: it hashes rows
                # in their order, not their numbers). Every rank gathered the same: all raise.
                raise ValueError(f"record_batch: step {step}: the ranks recorded {index.numel()} rows of field "
                                 f"'{field}' numbered up to {int(index.max())}: rows are positions 0..N-1 in the "
                                 f"step's global batch of N rows (sampler_rows gives a DistributedSampler's)")
            whole = torch.cat([t for _, t in pieces], 0)[torch.argsort(index, stable=True)]
            total = max(total, whole.shape[0])
            hashes[field] = _hash_rows(whole)
        h = hashlib.sha256()
        for field, digest in sorted(hashes.items()):
            h.update(field.encode() + b"\0" + digest.encode() + b"\0")
        self.input = {"step": step, "global": h.hexdigest(), "fields": hashes, "rows": total}
        if self.rank == 0:
            self._append("data/input_identity.jsonl", self.input)

    def after_clip(self, step, grad_norm):
        self.grad_norm_pre_clip = float(grad_norm)
        self._probe("grad_after_clip", step, {n: p.grad for n, p in self.model.named_parameters()})

    def after_optimizer(self, step):
        self._probe("after_optimizer", step, dict(self.model.named_parameters()))
        # Replica consistency: every rank's copy of every parameter, by its bytes' SHA-256
        # (collective), so that a rank whose copy left the others' is seen (rank 0's probes
        # alone cannot see it).
        mine = {n: _hash_rows(p) for n, p in self.model.named_parameters()}
        every = self._gather_objects(mine)
        if self.rank == 0:
            self._write(f"cases/runtime/replicas_step{step}.json", {"step": step, "parameters": {
                n: {"replicas": self.world, "compared": True, "pieces": 1, "digests": [d[n] for d in every]}
                for n in mine}})

    def end_step(self, step, loss, lr):
        """loss: the loss over the global batch (every rank's tokens), as a float."""
        norm = torch.sqrt(sum((p.grad.detach().to(torch.float64) ** 2).sum()
                              for p in self.model.parameters() if p.grad is not None))
        row = {"step": step, "loss": float(loss), "grad_norm_pre_clip": self.grad_norm_pre_clip,
               "grad_norm_post_clip": float(norm), "lr": float(lr), "input_hash": self.input["global"],
               "valid_tokens": int(self.input_valid_tokens()),
               "comm_bytes": {axis: sum(sites.values()) for axis, sites in self.comm.items()},
               "comm_sites": self.comm}
        ms = (time.monotonic() - self.step_start) * 1000.0
        self._append(f"cases/runtime/performance_rank{self.rank}.jsonl", {"step": step, "step_ms": ms})
        if self.rank == 0:
            self._append("cases/runtime/metrics.jsonl", row)

    def input_valid_tokens(self):
        labels = self.step_rows.get("labels", [])
        local = sum(int(t.ne(-100).sum()) for _, t in labels)
        return int(self._sum([float(local)])[0])

    def finish(self):
        """Ends the run: a barrier, so rank 0's files are whole when any rank returns; then rank 0
        releases the case directory's writer lock."""
        if self.distributed and self.world > 1:
            dist.barrier(group=self.group)
        if self.lock is not None:
            os.close(self.lock)
            self.lock = None
