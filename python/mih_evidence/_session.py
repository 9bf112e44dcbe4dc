"""Session: the hooks of mih's validation session for a PyTorch training loop (see the package's
docstring). Every rank calls every hook in the same order: several are collectives."""
import hashlib
import os
import time

import torch
import torch.distributed as dist

from . import _layout, _modules, _probes, _rows, _tables
from ._files import CaseFiles
from ._ledger import CommLedger
from ._stats import digest

VERSION = "0.4.0"
CONTRACT = {"contract": "mih-evidence", "version": 1}
PROBE_CAP = 256  # parameters probed when no watch list is given (the first ones, in model order)
# A step's hooks in their order; record_batch runs between begin_step and after_backward_before_clip.
HOOKS = ("begin_step", "after_backward_before_clip", "after_clip", "after_optimizer", "end_step")


def _mesh_axes(mesh, world, rank):
    """({axis: size}, {axis: coordinate}, {process group name: axis}) of the session's mesh: the
    DeviceMesh's named dims, or, without one, the world as dp_replicate (DDP)."""
    if mesh is None:
        return ({"dp_replicate": world}, {"dp_replicate": rank}, {}) if world > 1 else ({}, {}, {})
    names = mesh.mesh_dim_names
    if names is None or any(n not in _layout.AXES for n in names) or len(set(names)) != len(names):
        raise ValueError(f"mih_evidence.Session: the mesh's dims are named {names}; name each once with mih's axes "
                         f"{_layout.AXES}, e.g. init_device_mesh('cpu', (2, 2), mesh_dim_names=('dp_shard', 'tp'))")
    if int(torch.__version__.split(".")[0]) < 2:
        raise ValueError(f"mih_evidence.Session: a DeviceMesh needs torch 2.x (this is torch {torch.__version__}); "
                         f"on torch 1.13 pass the DDP module and no mesh")
    sizes = dict(zip(names, mesh.shape))
    unsupported = [n for n in ("pp", "ep", "cp") if sizes.get(n, 1) > 1]
    if unsupported:
        raise ValueError(f"mih_evidence.Session: the mesh has {unsupported} > 1, which this writer does not record yet "
                         f"(pipeline stages, expert groups, a sharded sequence); run those cases with mih's own "
                         f"runtime or its C++ TrainerSession")
    groups = {mesh.get_group(n): n for n in names}
    return ({n: mesh.size(i) for i, n in enumerate(names)}, dict(zip(names, mesh.get_coordinate())), groups)


def _grad(p):
    """p's gradient as synchronized: a pending (Partial) reduction done; None when it has none."""
    return None if p.grad is None else _layout.settled(p.grad)


def _collective_device(group):
    """The device a group's collectives take: the current CUDA device for NCCL, else the CPU."""
    backend = str(dist.get_backend(group)).lower() if group is not None else "gloo"
    return torch.device("cuda", torch.cuda.current_device()) if "nccl" in backend else torch.device("cpu")


class Session:
    """The hooks of a validation session for a PyTorch loop.

    case_dir: the case directory (<root>/<spec>/<case>; a resume's save phase: <case>/before_save);
      it must not hold a run already.
    model: the module being trained (a DistributedDataParallel wrapper is unwrapped for names;
      FSDP2 and tensor parallelism keep the model's FQNs).
    case, compare_to: this case's name and the case it must equal (its 1-rank run), or "".
    mesh: the DeviceMesh the model is parallelized over, its dims named with mih's axes
      (dp_replicate, dp_shard, cp, tp); None: the world is data-parallel (DDP) or one rank.
    config: the degrees when there is no mesh ({"dp_replicate": 2}), and case options
      ({"sequence_parallel": True}); a degree the mesh contradicts is refused.
    loss_scale: what each rank's backpropagated loss is over its share of the global loss:
      default the data-parallel size under DDP or FSDP2 (both average gradients), 1 on one data
      rank; required otherwise.
    watch: FQNs of the parameters probed (default: every parameter, at most probe_cap).
    probe_modules: FQNs of the modules whose outputs are probed (default: every submodule).
    grad_domain: fqn -> the axes its gradient must be reduced over (a dict or a function of
      (fqn, parameter)); default: the data axes of size > 1, and tp for a parameter not cut over
      tp when config says sequence_parallel.
    Raises FileExistsError when case_dir holds a run's evidence (nothing is overwritten),
    BlockingIOError, naming the holder, while another writer writes there, and ValueError for a
    mesh or configuration it cannot record.
    """

    def __init__(self, case_dir, model, case, compare_to="", config=None, group=None, dtype=None, steps=None,
                 loss_scale=None, mesh=None, watch=None, probe_cap=PROBE_CAP, probe_modules=None, grad_domain=None):
        self.dir = case_dir
        self.files = CaseFiles(case_dir)
        self.distributed = dist.is_available() and dist.is_initialized()
        self.group = group if group is not None else (dist.group.WORLD if self.distributed else None)
        self.rank = dist.get_rank(self.group) if self.distributed else 0
        self.world = dist.get_world_size(self.group) if self.distributed else 1
        self.device = _collective_device(self.group) if self.distributed else torch.device("cpu")
        self.ddp = isinstance(model, torch.nn.parallel.DistributedDataParallel)
        self.model = model.module if hasattr(model, "module") else model
        self.sizes, self.coords, groups = _mesh_axes(mesh, self.world, self.rank)
        self.config = self._config(config or {}, dtype, case)
        self.loss_scale = self._loss_scale(loss_scale)
        self.grad_domain = grad_domain
        self.sum_over = _probes.sum_over_group(self.group, self.device, self.distributed and self.world > 1)
        self.ledger = CommLedger(groups) if mesh is not None else None
        self.all_coords = self._gather_objects(self.coords)
        self.params = list(self.model.named_parameters())
        self.watch = self._watch(watch, probe_cap)
        self.modules = _modules.ModuleProbes(self.model, probe_modules, self.coords, self.sizes,
                                             lambda: self.model.training)
        self.modules.set_all_coords(self.all_coords)
        self.optimizer = None
        self.comm = {}
        self.step_rows = {}
        self.probed_initial = False
        self.phase = "end_step"  # the last hook of the step's order that ran (HOOKS)
        self.case = {"name": case, "kind": "reference" if not compare_to else "train",
                     "group": "reference" if not compare_to else "axis", "config": self.config,
                     "steps": int(steps or 0), "compare_to": compare_to, "device": self._param_device(),
                     "pg_backend": str(dist.get_backend(self.group)) if self.distributed else "gloo",
                     "world_size": self.world}
        self.lock = self.files.take() if self.rank == 0 else None
        if self.rank == 0:
            self._write_start()

    # ---- set-up ------------------------------------------------------------------------
    def _config(self, config, dtype, case):
        degrees = {"pp": 1, "dp_replicate": 1, "dp_shard": 1, "cp": 1, "tp": 1, "ep": 1}
        for axis, size in self.sizes.items():
            if axis in config and int(config[axis]) != size:
                raise ValueError(f"mih_evidence.Session: config says {axis}={config[axis]}, the mesh {axis}={size}")
            degrees[axis] = size
        options = dict(degrees, cp_layout="contiguous", sequence_parallel=False, activation_checkpointing=False,
                       micro_batches=1, vpp=1, pp_schedule="1f1b", noise_twin=False, seed=0, name=case)
        options.update(config)
        params = list(self.model.parameters())
        options["dtype"] = dtype or (_tables.dtype_name(params[0].dtype) if params else "float32")
        return options

    def _loss_scale(self, loss_scale):
        data = 1
        for axis in _layout.DATA_AXES:
            data *= self.config[axis]
        if loss_scale is not None:
            return float(loss_scale)
        if data == 1:
            return 1.0
        if self.ddp or _tables.fsdp_units(self.model):
            return float(data)
        raise ValueError(f"mih_evidence.Session: on {data} data-parallel ranks pass the DistributedDataParallel "
                         f"module, or build the session after fully_shard (FSDP2; both average the ranks' gradients, so "
                         f"each rank's loss carries the data-parallel size), or pass loss_scale=<what each rank's "
                         f"backpropagated loss is over its share of the global loss>")

    def _watch(self, watch, cap):
        names = [n for n, _ in self.params]
        if watch is None:
            chosen = names[:cap]
            reason = (f"whole model ({sum(p.numel() for _, p in self.params)} elements)" if len(names) <= cap else
                      f"the first {cap} of {len(names)} parameters (probe_cap)")
            return [(n, reason) for n in chosen]
        unknown = [n for n in watch if n not in names]
        if unknown:
            raise ValueError(f"mih_evidence.Session: watch names {unknown[:4]}, which are not parameters of the model "
                             f"(its FQNs: {names[:4]}...)")
        return [(n, "watch list") for n in watch]

    def _param_device(self):
        p = next(iter(self.model.parameters()), None)
        return "cuda" if p is not None and _layout.local(p).is_cuda else "cpu"

    def _write_start(self):
        self.files.write("environment.json", {
            "evidence_contract": dict(CONTRACT, writer=f"mih-evidence.py {VERSION} (python)"),
            "case": self.case, "world_size": self.world,
            "versions": {"torch": torch.__version__, "mih_evidence": VERSION}})
        self.files.write("config.resolved.json", self.config)
        shapes = dict(self.params)
        self.files.write("check/parameter_watchlist.json",
                         [{"fqn": n, "global_shape": list(shapes[n].shape), "reason": why} for n, why in self.watch])

    # ---- collectives -------------------------------------------------------------------
    def _quiet(self):
        return self.ledger.quiet() if self.ledger is not None else _Nothing()

    def _gather_objects(self, obj):
        if not (self.distributed and self.world > 1):
            return [obj]
        out = [None] * self.world
        with self._quiet():
            dist.all_gather_object(out, obj, group=self.group)
        return out

    def _probe(self, stage, step, tensors):
        """Statistics of whole tensors (name -> tensor or None) from the ranks' pieces."""
        pieces = _probes.Pieces()
        for name, t in tensors.items():
            _probes.parameter_piece(pieces, name, t, self.coords, f"'{name}' ({stage})")
        with self._quiet():
            out = pieces.reduce(self.sum_over)
        if self.rank == 0:
            self.files.append("probes/rank0.jsonl", {"stage": stage, "step": step, "tensors": out})

    def _watched(self, of=lambda p: p):
        params = dict(self.params)
        return {n: of(params[n]) for n, _ in self.watch}

    # ---- DDP's communication, ledgered (torch 1.13: no dispatch-mode ledger) -------------
    def ddp_comm_hook(self, state, bucket):
        """A DDP communication hook that all-reduces (average) as DDP does and ledgers the
        bytes: register with ddp_model.register_comm_hook(None, session.ddp_comm_hook)."""
        buffer = bucket.buffer()
        sites = self.comm.setdefault("dp_replicate", {})
        sites["ddp.all_reduce"] = sites.get("ddp.all_reduce", 0) + buffer.numel() * buffer.element_size()
        buffer.div_(self.world)
        fut = dist.all_reduce(buffer, group=self.group, async_op=True).get_future()
        return fut.then(lambda f: f.value()[0])

    # ---- the hooks -----------------------------------------------------------------------
    def attach_optimizer(self, optimizer):
        """After the model is parallelized and the optimizer built: the parameter table
        (placements per axis, FSDP2 units and their mixed precision) and the optimizer's groups."""
        self.optimizer = optimizer
        units = _tables.fsdp_units(self.model)
        rows = _tables.parameter_rows(self.params, self.sizes, self._domain, units)
        if type(optimizer).__name__ == "ZeroRedundancyOptimizer":
            for row in rows:
                row["optimizer_state"] = "sharded over dp_replicate (ZeroRedundancyOptimizer)"
        names = {id(p): n for n, p in self.params}
        if self.rank == 0:
            table = {"parameters": rows}
            if units:
                table["fsdp_units"] = _tables.unit_table(rows, units, self.sizes)
                self.files.write("check/fsdp_units.json", table["fsdp_units"])
            self.files.write("check/structure.json", table)
            self.files.write("check/optimizer_layout_initial.json",
                             {"phase": "structure", "groups": _tables.optimizer_groups(optimizer, names)})

    def _domain(self, fqn, p):
        if callable(self.grad_domain):
            return list(self.grad_domain(fqn, p))
        if isinstance(self.grad_domain, dict) and fqn in self.grad_domain:
            return list(self.grad_domain[fqn])
        axes = [a for a in _layout.DATA_AXES if self.config[a] > 1]
        cut = _layout.placements(p, self.sizes, fqn).get("tp", "Replicate()")
        if self.config.get("sequence_parallel") and self.config["tp"] > 1 and cut == "Replicate()":
            axes.append("tp")
        return axes

    def _enter_hook(self, hook, step):
        """Refuses a hook out of the step's order (HOOKS), naming the one missing."""
        before = "begin_step" if hook == "record_batch" else HOOKS[HOOKS.index(hook) - 1]
        ok = self.phase == before
        if not ok:
            raise ValueError(f"mih_evidence.Session.{hook}(step {step}): the last hook called was {self.phase}; call "
                             f"{before} first (each step: {', '.join(HOOKS[:1])}, record_batch per micro-batch, "
                             f"{', '.join(HOOKS[1:])})")
        if hook != "record_batch":
            self.phase = hook

    def begin_step(self, step):
        self._enter_hook("begin_step", step)
        if not self.probed_initial:  # the parameters the first step starts from (after a resume's load)
            self._probe("model_before", step, self._watched())
            self.probed_initial = True
        self.step_start = time.monotonic()
        self.step_rows = {}
        self.modules.clear()
        self.comm = {}
        if self.ledger is not None:
            self.ledger.sites = {}
            self.ledger.__enter__()

    def record_batch(self, step, micro_batch, rows, batch):
        """Per micro-batch, before its forward: which rows of the global batch this rank's
        micro-batch holds, and their fields. batch: {field: tensor [b, ...]}.

        rows: an int, the global row of the micro-batch's first row when its b rows are
          contiguous (rank r of W with b rows each: r * b); or a sequence (or int64 tensor) of
          b global row indices, one per row, in the order of the batch: what a
          DistributedSampler gives (see `sampler_rows`). Ranks of one data-parallel coordinate
          (tensor parallelism's ranks) record the same rows; each row is counted once.
        Raises ValueError when rows is neither, is negative, repeats a row, or does not give
        one row per row of every field."""
        self._enter_hook("record_batch", step)
        index = _rows.row_index(rows, batch)
        self.modules.row_index = index
        for field, t in batch.items():
            self.step_rows.setdefault(field, []).append((index, t.detach().cpu()))

    def after_backward_before_clip(self, step):
        """After backward and the gradients' synchronization (collective): the global batch's
        identity, the gradients' probes and every rank's digest of its gradient piece, and
        the module outputs of the step and their gradients."""
        self._enter_hook("after_backward_before_clip", step)
        if self.ddp and self.world > 1 and self.ledger is None and not self.comm:
            raise ValueError("mih_evidence.Session: DDP moved no gradient through the session's ledger: register "
                             "ddp_model.register_comm_hook(None, session.ddp_comm_hook) before the first step, or "
                             "GradientSync cannot see its all-reduce")
        with self._quiet():
            self._input_identity(step)
            self._probe("grad_before_clip", step, self._watched(_grad))
            self._gradient_replicas(step)
            for stage in ("forward_output", "output_grad"):
                self._module_stage(stage, step)

    def _module_stage(self, stage, step):
        scale = self.loss_scale if stage == "output_grad" else 1.0
        order, tensors, unplaced = self.modules.reduce(stage, self._gather_objects, self.sum_over)
        for s in tensors.values():
            if scale != 1.0:  # the gradient of the global loss: what this rank backpropagated over loss_scale
                s.update(sum=s["sum"] / scale, sum_sq=s["sum_sq"] / scale ** 2, sketch=[v / scale for v in s["sketch"]])
        if self.rank == 0 and (order or unplaced):
            row = {"stage": stage, "step": step, "order": order, "tensors": tensors}
            if unplaced:
                row["unplaced"] = unplaced
            self.files.append("probes/rank0.jsonl", row)

    def _counts_rows(self):
        return all(self.coords.get(a, 0) == 0 for a in _modules.SPLIT_AXES)

    def _input_identity(self, step):
        every = self._gather_objects((bool(self.step_rows), self.step_rows if self._counts_rows() else {}))
        silent = [r for r, (recorded, _) in enumerate(every) if not recorded]
        if silent:  # every rank raises: each gathered the same
            raise ValueError(f"mih_evidence.Session: step {step}: rank(s) {silent} recorded no micro-batch: call "
                             f"record_batch(step, micro_batch, rows, batch) before each micro-batch's forward")
        gathered = [rows for _, rows in every]
        fields = {}
        for rows in gathered:
            for field, pieces in rows.items():
                fields.setdefault(field, []).extend(pieces)
        hashes, total = {}, 0
        for field, pieces in sorted(fields.items()):
            index = torch.cat([i for i, _ in pieces], 0)
            if index.numel() and int(index.max()) >= index.numel():
                raise ValueError(f"record_batch: step {step}: the ranks recorded {index.numel()} rows of field "
                                 f"'{field}' numbered up to {int(index.max())}: rows are positions 0..N-1 in the "
                                 f"step's global batch of N rows (sampler_rows gives a DistributedSampler's)")
            whole = torch.cat([t for _, t in pieces], 0)[torch.argsort(index, stable=True)]
            total = max(total, whole.shape[0])
            hashes[field] = digest(whole)
        h = hashlib.sha256()
        for field, d in sorted(hashes.items()):
            h.update(field.encode() + b"\0" + d.encode() + b"\0")
        self.input = {"step": step, "global": h.hexdigest(), "fields": hashes, "rows": total}
        labels = [t for _, t in fields.get("labels", [])]
        self.valid_tokens = int(sum(int(t.ne(-100).sum()) for t in labels))
        if self.rank == 0:
            self.files.append("data/input_identity.jsonl", self.input)

    def _pieces(self, of):
        """Every rank's (box, digest) of of(parameter) per FQN (collective)."""
        mine = {}
        for fqn, p in self.params:
            t = of(p)
            if t is None:
                mine[fqn] = (_layout.box_text(_layout.box(p, fqn)), None)
            else:
                mine[fqn] = (_layout.box_text(_layout.box(t, fqn)), digest(t))
        return self._gather_objects(mine)

    @staticmethod
    def _replica_record(fqn, every):
        boxes = [r[fqn][0] for r in every]
        held = {}
        for b in boxes:
            if b:
                held[b] = held.get(b, 0) + 1
        most = max(held.values()) if held else 1
        return {"replicas": most, "compared": most > 1, "pieces": len(held), "boxes": boxes,
                "digests": [r[fqn][1] for r in every]}

    def _gradient_replicas(self, step):
        every = self._pieces(_grad)
        reductions = self.ledger.reducing_bytes() if self.ledger is not None else {
            a: sum(s.values()) for a, s in self.comm.items()}
        if self.rank != 0:
            return
        rows = {}
        for fqn, p in self.params:  # a frozen parameter too: no rank's gradient, reduced over nothing
            rec = self._replica_record(fqn, every)
            rec.update(grad_domain=self._domain(fqn, p) if p.requires_grad else [],
                       placements=_layout.placements(p, self.sizes, fqn))
            rows[fqn] = rec
        self.files.write(f"cases/runtime/gradient_replicas_step{step}.json",
                         {"step": step, "reductions": {a: b for a, b in reductions.items() if a != "world"},
                          "parameters": rows})

    def after_clip(self, step, grad_norm):
        """After clipping: the gradient norm before clipping, as the loop computed it (a
        DTensor norm is read whole)."""
        self._enter_hook("after_clip", step)
        if _layout.is_dtensor(grad_norm):
            grad_norm = grad_norm.full_tensor()
        self.grad_norm_pre_clip = float(grad_norm)
        with self._quiet():
            self._probe("grad_after_clip", step, self._watched(_grad))

    def after_optimizer(self, step):
        """After optimizer.step() (collective): the parameters' probes, every rank's digest of
        its piece of every parameter, and the optimizer's groups and state shapes."""
        self._enter_hook("after_optimizer", step)
        with self._quiet():
            self._probe("after_optimizer", step, self._watched())
            every = self._pieces(lambda p: p)
        if self.rank == 0:
            self.files.write(f"cases/runtime/replicas_step{step}.json", {"step": step, "parameters": {
                fqn: self._replica_record(fqn, every) for fqn, _ in self.params}})
            names = {id(p): n for n, p in self.params}
            self.files.write(f"cases/runtime/optimizer_layout_step{step}.json", {
                "phase": "runtime", "groups": _tables.optimizer_groups(self.optimizer, names),
                "state": _tables.state_shapes(self.optimizer, self.params)})

    def end_step(self, step, loss, lr):
        """loss: the loss over the global batch (every rank's tokens), as a float."""
        self._enter_hook("end_step", step)
        if self.ledger is not None:
            self.ledger.__exit__(None, None, None)
            self.comm = self.ledger.sites
        with self._quiet():
            pieces = _probes.Pieces()
            for fqn, p in self.params:
                _probes.parameter_piece(pieces, fqn, _grad(p), self.coords, fqn)
            stats = pieces.reduce(self.sum_over)
        norm = sum(s["sum_sq"] for s in stats.values()) ** 0.5
        comm = {a: s for a, s in self.comm.items() if a != "world"}
        row = {"step": step, "loss": float(loss), "grad_norm_pre_clip": self.grad_norm_pre_clip,
               "grad_norm_post_clip": float(norm), "lr": float(lr), "input_hash": self.input["global"],
               "valid_tokens": self.valid_tokens, "comm_bytes": {a: sum(s.values()) for a, s in comm.items()},
               "comm_sites": comm}
        ms = (time.monotonic() - self.step_start) * 1000.0
        self.files.append(f"cases/runtime/performance_rank{self.rank}.jsonl", {"step": step, "step_ms": ms})
        if self.rank == 0:
            self.files.append("cases/runtime/metrics.jsonl", row)

    def capture_checkpoint_payload(self, event, next_step):
        """After a checkpoint is saved ("save") or loaded ("load"), e.g. by
        torch.distributed.checkpoint (collective): the SHA-256 of every whole parameter and of
        Adam's moments (float64 bytes), and the step the run resumes at. The save phase's
        session writes into <case>/before_save (its case_dir), the load phase's into <case>;
        CheckpointRoundTrip compares the two, across a reshard too.
        Raises ValueError for another event or a case_dir that does not fit the event."""
        if event not in ("save", "load"):
            raise ValueError(f"capture_checkpoint_payload: event '{event}' is neither save nor load")
        nested = os.path.basename(os.path.normpath(self.dir)) == "before_save"
        if nested != (event == "save"):
            raise ValueError(f"capture_checkpoint_payload('{event}'): the save is captured by the save phase's "
                             f"session, whose case_dir is <case>/before_save, the load by the load phase's, whose "
                             f"case_dir is <case>; this session's is {self.dir}")
        tensors = {}
        with self._quiet():
            for fqn, p in self.params:
                self._record_whole(tensors, fqn, p)
                state = self.optimizer.state.get(p, {}) if self.optimizer is not None else {}
                for moment in _tables.MOMENTS:
                    if p.requires_grad and moment in state:
                        self._record_whole(tensors, f"{fqn}/{moment}", state[moment])
        if self.rank == 0:
            self.files.write(f"checkpoint/roundtrip_{event}.json", {"tensors": tensors, "next_step": int(next_step)})

    def _record_whole(self, tensors, name, t):
        whole = self._whole(t, f"'{name}'")
        tensors[name] = {"sha256": digest(whole), "shape": list(whole.shape)}

    def _whole(self, t, where):
        """The whole tensor t in float64 on the CPU: a DTensor assembled from every rank's piece
        placed at its box (each element from its counted copy) by one all-reduce, not by
        full_tensor(), which torch 2.8 assembles in the wrong row order for an uneven strided
        shard (FSDP x TP over a dim that dp_shard x tp does not divide)."""
        if not _layout.is_dtensor(t):
            return t.detach().to(torch.float64).contiguous().cpu()
        bounds = _layout.box(t, where)
        whole = torch.zeros(tuple(t.shape), dtype=torch.float64, device=self.device)
        if _layout.counted(t, self.coords, where) and all(e > s for s, e in bounds):
            whole[tuple(slice(s, e) for s, e in bounds)] = _layout.local(t).detach().to(self.device, torch.float64)
        if self.distributed and self.world > 1:
            dist.all_reduce(whole, group=self.group)
        return whole.cpu()

    def finish(self):
        """Ends the run: a barrier, so rank 0's files are whole when any rank returns; then rank 0
        releases the case directory's writer lock."""
        if self.distributed and self.world > 1:
            with self._quiet():
                dist.barrier(group=self.group)
        if self.lock is not None:
            os.close(self.lock)
            self.lock = None


class _Nothing:
    def __enter__(self):
        return self

    def __exit__(self, *exc):
        return False
