# Write my_chunks: worker `worker` of `workers` takes a contiguous run of self.epoch_order()
class BlockStream(ChunkStream):
    def my_chunks(self, worker, workers):
        order = self.epoch_order()
        size, longer = divmod(len(order), workers)  # the first `longer` runs are one chunk longer
        start = worker * size + min(worker, longer)
        return order[start : start + size + (worker < longer)]
