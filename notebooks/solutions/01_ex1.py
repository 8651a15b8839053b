# Every reader needs buffer_chunks whole chunks, so all of them together need readers x buffer_chunks;
# chunks of c rows give rows // c whole chunks: the longest c with rows // c >= readers x buffer_chunks.
def my_longest_chunk(rows, readers, buffer_chunks):
    return rows // (readers * buffer_chunks)
