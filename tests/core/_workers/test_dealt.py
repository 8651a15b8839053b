"""The pieces of ``batch_order="rank"`` (zarrtorch._workers.dealt): dealt out in turn to the workers, sent through a
ring of reused shared-memory slots, each slot held in the training process for as long as any view of its rows
lives; a worker that finds no free slot sends through DataLoader's queue instead, never into a slot still held."""

from __future__ import annotations

import numpy as np
import torch

from zarrtorch._workers.dealt import PIECE, DealtPieces, dealt, items, piece_ring, pieces_of, sent
from zarrtorch._workers.ring import FREE, REF, BatchRing, RingShape

ROW = (3,)
X = np.arange(14 * 3, dtype=np.float32).reshape(14, *ROW)
PIECES = np.array([[0, 4], [4, 8], [8, 12], [12, 14], [0, 4], [4, 8]])  # 4-row slots; the last two: a next epoch


def ring_of(slots: int) -> BatchRing:
    ring = BatchRing(RingShape(workers=1, slots=slots, batch_size=4, columns=(("x", ROW, "float32"),)))
    ring.start_epoch()
    return ring


def sent_piece(k: int, writer) -> dict:
    start, stop = PIECES[k]
    return sent(PIECES[k], {"x": X[start:stop]}, writer)


def test_workers_are_dealt_pieces_in_turn():
    pieces = np.arange(7)
    assert [dealt(pieces, w, 3, per_item=1).tolist() for w in range(3)] == [[0, 3, 6], [1, 4], [2, 5]]


def test_workers_are_dealt_groups_of_consecutive_pieces_in_turn():
    pieces = np.arange(11)
    assert [dealt(pieces, w, 3, per_item=2).tolist() for w in range(3)] == [[0, 1, 6, 7], [2, 3, 8, 9], [4, 5, 10]]


def in_turn(per_worker: list[list]) -> list:
    """DataLoader's order with ``in_order=True``: an item of each worker in turn, worker 0 first, skipping a
    worker once it has ended."""
    out, left = [], [iter(w) for w in per_worker]
    while left:
        for it in list(left):
            item = next(it, None)
            if item is None:
                left.remove(it)
            else:
                out.append(item)
    return out


def test_several_pieces_per_item_come_back_as_the_streams_pieces_in_order():
    """Regression for several pieces per DataLoader item (fewer items for the training process to receive): the
    items, handed back in turn, must give the stream's pieces in order whatever the workers, the pieces per item
    and the count (a last group shorter than the others, workers with no group at all)."""
    for workers in range(1, 5):
        for per_item in (1, 2, 3, 4):
            for count in range(13):
                pieces = np.arange(count)
                per_worker = [
                    list(items(({PIECE: int(p)} for p in dealt(pieces, w, workers, per_item)), per_item))
                    for w in range(workers)
                ]
                got = [piece[PIECE] for piece in pieces_of(iter(in_turn(per_worker)))]
                assert got == pieces.tolist(), (workers, per_item, count)


def test_a_piece_in_a_slot_travels_as_plain_ints():
    """A piece written into a slot sends only its rows and the slot's number (no tensor: no shared-memory segment
    and file descriptor of its own); without a ring, a tensor in shared memory."""
    writer = ring_of(2).writer(0)
    item = sent_piece(0, writer)
    assert item == {PIECE: [0, 4], REF: [0, 0, 4]}
    queued = sent_piece(1, None)
    assert queued[PIECE] == [4, 8] and torch.equal(queued["x"], torch.from_numpy(X[4:8]))


def test_a_slot_whose_rows_are_still_referenced_is_never_written_again_until_they_are_freed():
    """Regression for the piece ring: a slot given back as soon as its piece arrived would be written again by
    the worker while the buffer or a batch still read its rows (a wrong batch, never an error). A slot is held
    until the last view of its rows is freed; a worker that finds every slot held sends through the queue."""
    ring = ring_of(2)
    writer = ring.writer(0)
    items = [sent_piece(k, writer) for k in range(3)]
    assert [REF in item for item in items] == [True, True, False]  # both slots in flight: the third queued
    received = iter(items)
    pieces = DealtPieces(received, arrays={}, chunk_rows=4, rows_reader=None, ring=ring)
    taken = pieces.iter_pieces(PIECES[:5])
    first, second, third = next(taken), next(taken), next(taken)
    items.append(sent_piece(3, writer))  # rows of slots 0 and 1 still referenced
    assert REF not in items[-1]
    tail = first["x"][2:]  # a view keeps the slot held, as the buffer's segments do
    del first, second
    items.append(sent_piece(4, writer))  # slot 1 is free again, slot 0 is not
    assert items[-1][REF] == [0, 1, 4]
    fourth, fifth = next(taken), next(taken)
    np.testing.assert_array_equal(tail, X[2:4])
    for got, (start, stop) in zip((third, fourth, fifth), PIECES[2:5], strict=True):
        np.testing.assert_array_equal(got["x"], X[start:stop])
    del tail, third, fourth, fifth, got
    taken.close()  # the reader lets go of its last piece
    assert (ring.busy.numpy() == FREE).all()


def test_a_piece_with_more_rows_than_a_slot_goes_through_the_queue():
    writer = ring_of(2).writer(0)
    item = sent(np.array([0, 5]), {"x": np.zeros((5, *ROW), np.float32)}, writer)
    assert REF not in item and item["x"].shape == (5, *ROW)


def test_the_ring_has_a_chunk_per_slot_and_none_with_the_queue(tmp_path):
    from zarrtorch import ZarrIterableDataset, prepare_zarr

    path = tmp_path / "s.zarr"
    prepare_zarr({"x": X, "y": np.arange(14)}, path, chunk_rows=4, progress=False)
    ds = ZarrIterableDataset(path)
    ring = piece_ring(ds, num_workers=2, prefetch_factor=2, transport=None)
    assert ring.shape.batch_size == 4 and {c[0] for c in ring.shape.columns} == {"x", "y"}
    assert ring.nbytes == 2 * ring.shape.slots * 4 * (3 * 4 + 8)
    assert piece_ring(ds, num_workers=2, prefetch_factor=2, transport="queue") is None
