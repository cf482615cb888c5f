"""The ``media`` section: where uploads are kept, how large they may be, which
thumbnails are made, and who may upload how fast.

The process that serves media is chosen by the top-level ``media_instance``
(read with the rest of the top level in ``homeserver.py``); this section says
how it serves it. ``docs/configuration.md`` describes each setting and
``docs/media.md`` the repository.
"""

from __future__ import annotations

import os

import attr

from synapse_lite.config.validation import Section

THUMBNAIL_METHODS = ("crop", "scale")

#: The sizes made right after an image is uploaded, unless configured
#: otherwise: what Matrix clients ask for (avatars, timeline previews).
DEFAULT_THUMBNAIL_SIZES = (
    (32, 32, "crop"),
    (96, 96, "crop"),
    (320, 240, "scale"),
    (640, 480, "scale"),
    (800, 600, "scale"),
)


@attr.s(slots=True, frozen=True, auto_attribs=True)
class ThumbnailSize:
    """One thumbnail size the repository makes: ``crop`` is exactly this
    size; ``scale`` fits within it, keeping the aspect ratio."""

    width: int
    height: int
    method: str

    @classmethod
    def read(cls, section: Section) -> ThumbnailSize:
        result = cls(
            width=section.get_int("width", minimum=1, maximum=4096),
            height=section.get_int("height", minimum=1, maximum=4096),
            method=section.get_str("method", "scale", choices=THUMBNAIL_METHODS),
        )
        section.finish()
        return result


@attr.s(slots=True, frozen=True, auto_attribs=True)
class UploadRateLimit:
    """Uploads (and ``create`` calls) per user: ``per_second`` sustained,
    ``burst`` at once."""

    per_second: float = 1.0
    burst: int = 20


@attr.s(slots=True, frozen=True, auto_attribs=True)
class StorageProviderConfig:
    """Another place media files are kept besides the local store (see
    ``synapse_lite/media/storage.py``). ``directory``: a directory, e.g. a
    mounted network share."""

    kind: str
    path: str

    @classmethod
    def read(cls, section: Section, base_dir: str) -> StorageProviderConfig:
        kind = section.get_str("type", choices=("directory",))
        path = os.path.normpath(os.path.join(base_dir, section.get_str("path")))
        section.finish()
        return cls(kind, path)


@attr.s(slots=True, frozen=True, auto_attribs=True)
class MediaConfig:
    """How the media repository stores and serves uploads."""

    #: The directory files are kept in (absolute).
    store_path: str
    max_upload_size: int = 50 * 1024**2
    #: Images with more pixels than this are not thumbnailed (a small file
    #: can decode to gigabytes: a decompression bomb).
    max_image_pixels: int = 32_000_000
    #: Frames of an animated image put into an animated thumbnail at most.
    max_thumbnail_frames: int = 100
    thumbnail_sizes: tuple[ThumbnailSize, ...] = attr.ib(
        factory=lambda: tuple(ThumbnailSize(w, h, m) for w, h, m in DEFAULT_THUMBNAIL_SIZES)
    )
    #: Serve the deprecated unauthenticated ``/_matrix/media/v3/download``,
    #: ``thumbnail`` and ``config``.
    legacy_unauthenticated_endpoints: bool = False
    upload_rate_limit: UploadRateLimit = attr.ib(factory=UploadRateLimit)
    #: ``POST /_matrix/media/v1/create`` ids a user may have waiting for content.
    max_pending_uploads: int = 10
    #: How long an id from ``create`` waits for its content.
    unused_expires_after_ms: int = 24 * 3600 * 1000
    #: The longest a download waits for content not yet uploaded (``timeout_ms``).
    max_download_wait_ms: int = 60_000
    storage_providers: tuple[StorageProviderConfig, ...] = ()
    #: Serve URL previews (``preview_url``): this server then fetches pages
    #: users name (``outbound_requests`` says from where not).
    url_previews: bool = False

    @classmethod
    def read(cls, section: Section, data_dir: str, base_dir: str) -> MediaConfig:
        store_path = os.path.normpath(
            os.path.join(data_dir, section.get_str("store_path", "media"))
        )
        max_upload_size = section.get_byte_size("max_upload_size", 50 * 1024**2, minimum=1)
        sizes = tuple(
            ThumbnailSize.read(s) for s in section.get_list_of_sections("thumbnail_sizes", [])
        )
        if "thumbnail_sizes" not in section.data:
            sizes = tuple(ThumbnailSize(w, h, m) for w, h, m in DEFAULT_THUMBNAIL_SIZES)
        rate = section.get_section("upload_rate_limit")
        upload_rate_limit = UploadRateLimit(
            per_second=rate.get_float("per_second", 1.0, minimum=0.0),
            burst=rate.get_int("burst", 20, minimum=1),
        )
        rate.finish()
        result = cls(
            store_path=store_path,
            max_upload_size=max_upload_size,
            max_image_pixels=section.get_int("max_image_pixels", 32_000_000, minimum=1),
            max_thumbnail_frames=section.get_int("max_thumbnail_frames", 100, minimum=1),
            thumbnail_sizes=sizes,
            legacy_unauthenticated_endpoints=section.get_bool(
                "legacy_unauthenticated_endpoints", False
            ),
            upload_rate_limit=upload_rate_limit,
            max_pending_uploads=section.get_int("max_pending_uploads", 10, minimum=1),
            unused_expires_after_ms=section.get_int(
                "unused_expires_after_ms", 24 * 3600 * 1000, minimum=1000
            ),
            max_download_wait_ms=section.get_int("max_download_wait_ms", 60_000, minimum=0),
            storage_providers=tuple(
                StorageProviderConfig.read(s, base_dir)
                for s in section.get_list_of_sections("storage_providers", [])
            ),
            url_previews=section.get_bool("url_previews", False),
        )
        section.finish()
        return result
