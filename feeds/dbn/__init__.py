"""DBN I/O with Databento's own libraries.

* :mod:`feeds.dbn.reader`: :func:`read_mbp10`, :func:`iter_mbp10`, :func:`read_metadata`;
* :mod:`feeds.dbn.writer`: :func:`write_mbp10`, :class:`DBNAppender` (the recorder's writer);
* :mod:`feeds.dbn.stream`: :class:`StreamDecoder` for live bytes, :func:`record_bytes` /
  :func:`record_messages` for publishing;
* :mod:`feeds.dbn.framing`: the record-header checks they share.
"""

from feeds.dbn.reader import DBNInfo, dbn_files, iter_mbp10, read_mbp10, read_metadata
from feeds.dbn.stream import StreamCounters, StreamDecoder, record_bytes, record_messages
from feeds.dbn.writer import DBNAppender, build_metadata, write_mbp10

__all__ = [
    "DBNAppender",
    "DBNInfo",
    "StreamCounters",
    "StreamDecoder",
    "build_metadata",
    "dbn_files",
    "iter_mbp10",
    "read_mbp10",
    "read_metadata",
    "record_bytes",
    "record_messages",
    "write_mbp10",
]
