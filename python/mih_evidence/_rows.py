"""Which rows of the step's global batch a rank's micro-batch holds (record_batch's `rows`)."""
import numbers

import torch


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


def row_index(rows, batch):
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


_row_index = row_index  # the name the writer 0.3 had
