"""The media repository: uploads, downloads and thumbnails (``docs/media.md``).

One process, the ``media_instance``, serves every media request; the others
refuse media paths with an error naming it. ``paths`` names files on disk,
``storage`` writes and reads them (the local store and any storage providers),
``thumbnailer`` makes thumbnails with Pillow, ``repository`` holds the logic
(limits, asynchronous uploads, which thumbnail answers a request),
``remote`` fetches and caches other servers' media, ``multipart`` writes and
reads the federation media answers, and ``servlets`` the HTTP endpoints
(the federation media ones too), streaming bodies both ways.
"""
