"""mih_evidence: the evidence contract (docs/evidence.md, mih-evidence version 1) written from a
PyTorch training loop, so that `mih check` judges a run of your own trainer against its 1-rank
run. torch only (1.13 with DDP; 2.x with FSDP2, DTensor tensor and sequence parallelism, HSDP and
torch.distributed.checkpoint); installed as share/mih/python/mih_evidence/ (a package:
PYTHONPATH=<prefix>/share/mih/python). docs/torch2-trainers.md walks a torch 2.x trainer through.

A loop calls the hooks of mih's validation session at the same points (every rank calls every
hook: some are collectives over the group). Create the session after the model is parallelized
(fully_shard, parallelize_module: the parameters are then the ones the optimizer steps):

    ev = mih_evidence.Session("runs/fsdp2/mymodel/DpShard2", model, case="DpShard2",
                              compare_to="Reference", mesh=mesh)        # mesh dims: mih's axes
    ev.attach_optimizer(optimizer)
    for step in range(steps):
        ev.begin_step(step)
        for mb, (rows, batch) in enumerate(micro_batches):    # batch: {"input_ids": ..., "labels": ...}
            ev.record_batch(step, mb, rows, batch)              # rows: its global rows (or the first)
            ...forward, backward...
        ev.after_backward_before_clip(step)                     # the gradients, synchronized
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        ev.after_clip(step, norm)
        optimizer.step()
        ev.after_optimizer(step)
        ev.end_step(step, loss=global_loss, lr=lr)              # the loss over the global batch
    ev.finish()

A resume: the save phase's session writes into <case>/before_save and calls
ev.capture_checkpoint_payload("save", next_step) after its checkpoint is saved; the load
phase's session writes into <case> and calls capture_checkpoint_payload("load", next_step)
after the load, then trains from next_step.

What it writes, under the case directory (rank 0; every value global, reduced over the group
from the ranks' pieces, each element counted once, nothing gathered whole but a checkpoint's
hashes): environment.json, config.resolved.json, check/structure.json (the parameter table:
FQN, global and local shape, offset, placement per mesh axis read from DTensor placements
(FSDP2's Shard(0) over dp_shard, Replicate() over dp_replicate, tp's Shard/Replicate), the
gradient's domain, the FSDP2 unit; fsdp_units with each unit's mixed-precision policy),
check/optimizer_layout_initial.json (the optimizer's groups), check/parameter_watchlist.json,
data/input_identity.jsonl, cases/runtime/metrics.jsonl (loss, grad norms, lr, input hash, the
bytes of every collective per mesh axis: a dispatch mode sees FSDP2's, HSDP's and DTensor's
collectives on torch 2.x; DDP's through `Session.ddp_comm_hook` on 1.13),
cases/runtime/performance_rank<r>.jsonl, cases/runtime/replicas_step<k>.json and
gradient_replicas_step<k>.json (every rank's box and SHA-256 of its piece of every parameter
and gradient), cases/runtime/optimizer_layout_step<k>.json (groups and the state's local
shapes), probes/rank0.jsonl (watched parameters, their gradients, every probed module's
forward output and output gradient per step in global row coordinates; a tuple or dataclass
output through its first tensor), checkpoint/roundtrip_{save,load}.json.
"""
from ._files import WRITER_LOCK, _make_own_directory  # noqa: F401
from ._rows import _row_index, row_index, sampler_rows  # noqa: F401
from ._session import CONTRACT, PROBE_CAP, VERSION, Session  # noqa: F401
from ._stats import PROJECTIONS, VALUES_UP_TO, digest, projection_signs, tensor_statistics  # noqa: F401
