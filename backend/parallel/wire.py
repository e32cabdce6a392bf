"""Each step's `ForwardBatch`, from rank 0 to the other ranks: two broadcasts.

A fixed header (the op and every length) then one int64 payload: the token tensors and the
rows of `req_to_token` the batch reads, cut to the longest sequence (rows renumbered from 0),
so a step ships kilobytes, never the whole table.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

from plait.backend.model.forward_batch import ForwardBatch
from plait.backend.parallel.comm import TPComm

OP_STOP, OP_FORWARD = 0, 1
HEADER = 12  # int64 entries
_TOKEN_FIELDS = ("input_ids", "positions", "out_slots")
_REQ_FIELDS = ("prefix_lens", "extend_lens")


@dataclass(frozen=True)
class Compact:
    """A batch whose table holds only its own rows (what every rank runs)."""

    batch: ForwardBatch
    table: torch.Tensor  # int64 [rows, width]


def compact(batch: ForwardBatch) -> Compact:
    """`batch` with `req_to_token` cut to the rows it reads, renumbered 0.., and its columns
    to the longest sequence."""
    rows = torch.cat([batch.req_rows, batch.decode_rows])
    unique, inverse = torch.unique(rows, return_inverse=True)
    nreq = batch.req_rows.numel()
    lens = torch.cat([batch.seq_lens, batch.decode_seq_lens, torch.ones(1, dtype=torch.int64)])
    width = int(lens.max())
    table = batch.req_to_token[unique, :width].to(torch.int64)
    small = ForwardBatch(
        input_ids=batch.input_ids, positions=batch.positions, out_slots=batch.out_slots,
        req_rows=inverse[:nreq], prefix_lens=batch.prefix_lens, extend_lens=batch.extend_lens,
        num_extend_reqs=batch.num_extend_reqs, num_extend_tokens=batch.num_extend_tokens,
        decode_rows=inverse[nreq:], decode_seq_lens=batch.decode_seq_lens,
        logit_indices=batch.logit_indices, req_to_token=table.to(torch.int32),
        decode_shared_prefix=batch.decode_shared_prefix,
    )  # fmt: skip
    return Compact(small, table)


def send_batch(comm: TPComm, batch: ForwardBatch) -> ForwardBatch:
    """Broadcast `batch` (rank 0); returns the compact batch rank 0 runs too."""
    small = compact(batch)
    b = small.batch
    header = torch.tensor(
        [OP_FORWARD, b.num_tokens, b.req_rows.numel(), b.decode_rows.numel(),
         b.logit_indices.numel(), *small.table.shape, b.num_extend_reqs, b.num_extend_tokens,
         b.decode_shared_prefix, 0, 0],
        dtype=torch.int64,
    )  # fmt: skip
    payload = torch.cat([
        *(getattr(b, f) for f in _TOKEN_FIELDS), b.req_rows, *(getattr(b, f) for f in _REQ_FIELDS),
        b.decode_rows, b.decode_seq_lens, b.logit_indices, small.table.reshape(-1),
    ])  # fmt: skip
    comm.broadcast(header.to(comm.device))
    comm.broadcast(payload.to(comm.device))
    return b


def send_stop(comm: TPComm) -> None:
    """Tell the followers to leave their loop."""
    header = torch.zeros(HEADER, dtype=torch.int64)
    comm.broadcast(header.to(comm.device))


def recv_batch(comm: TPComm) -> ForwardBatch | None:
    """The next batch from rank 0, or None when told to stop."""
    header = comm.broadcast(torch.zeros(HEADER, dtype=torch.int64, device=comm.device)).cpu()
    op, t, nreq, nd, nl, rows, width, ne, net, shared = header[:10].tolist()
    if op == OP_STOP:
        return None
    size = 3 * t + 3 * nreq + 2 * nd + nl + rows * width
    payload = comm.broadcast(torch.empty(size, dtype=torch.int64, device=comm.device)).cpu()
    parts = payload.split([t, t, t, nreq, nreq, nreq, nd, nd, nl, rows * width])
    return ForwardBatch(
        input_ids=parts[0], positions=parts[1], out_slots=parts[2], req_rows=parts[3],
        prefix_lens=parts[4], extend_lens=parts[5], num_extend_reqs=ne, num_extend_tokens=net,
        decode_rows=parts[6], decode_seq_lens=parts[7], logit_indices=parts[8],
        req_to_token=parts[9].reshape(rows, width).to(torch.int32), decode_shared_prefix=shared,
    )  # fmt: skip
