def smallest_buffer(goal):
    for k in range(1, rows // chunk_rows + 1):  # a buffer larger than the store never fills
        d = zt.ZarrIterableDataset(store, seed=SEED, buffer_chunks=k)
        spread = np.mean(
            [
                measures(d.batch_row_ids(epoch=e, batch_size=BATCH, drop_last=True))["batch-mean spread"]
                for e in (0, 1, 2)
            ]
        )
        if spread <= goal:
            return k, d.worker_memory_bytes()
    raise ValueError(f"no buffer that fits the store reaches a batch-mean spread of {goal}")
