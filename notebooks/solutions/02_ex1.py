per_rank = -(-rows // 3)  # every row is read: ceil(rows / 3) rows per rank
batches_per_rank = -(-per_rank // 50)  # the last batch may be partial
read_twice = package_stream(0)[: 3 * per_rank - rows]  # the padding repeats the stream's first rows
