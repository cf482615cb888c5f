"""Thumbnails with Pillow. Everything here blocks: callers run it in a thread.

* ``scale`` fits the image within the asked size, keeping its aspect ratio;
  ``crop`` fills exactly the asked size (scaled to cover it, then centred and
  cropped). Neither ever enlarges: an image smaller than the asked size gives
  a thumbnail of its own size (``crop`` keeps the asked aspect ratio).
* The EXIF orientation is applied first, so a photo taken sideways is
  thumbnailed upright.
* Decompression bombs: the pixel count is read from the header and an image
  above ``max_pixels`` is refused before anything is decoded. JPEGs are decoded
  at reduced size when the thumbnail is much smaller (Pillow's ``draft``).
* Animated GIF, WebP and PNG give an animated WebP when asked
  (``animated=true``), of at most ``max_frames`` frames; otherwise the first
  frame. Static thumbnails of JPEGs are JPEGs; of anything else, PNGs (they
  keep transparency).
"""

from __future__ import annotations

import io
import warnings
from typing import Any

import attr
from PIL import Image, ImageOps, ImageSequence, UnidentifiedImageError

#: Content types Pillow is asked to read; anything else is not thumbnailed.
THUMBNAILABLE_TYPES = ("image/jpeg", "image/png", "image/gif", "image/webp", "image/apng")

_JPEG_QUALITY = 80


class ThumbnailError(Exception):
    """The content cannot be thumbnailed; ``too_large`` when because of its size."""

    def __init__(self, message: str, too_large: bool = False) -> None:
        super().__init__(message)
        self.too_large = too_large


@attr.s(slots=True, frozen=True, auto_attribs=True)
class Thumbnail:
    data: bytes
    media_type: str
    width: int
    height: int


def _open(path: str, max_pixels: int) -> Image.Image:
    try:
        with warnings.catch_warnings():
            # Pillow warns (then raises) about bombs by its own global limit;
            # ours is checked below, with a message for the user.
            warnings.simplefilter("ignore", Image.DecompressionBombWarning)
            image = Image.open(path)
    except Image.DecompressionBombError:
        raise ThumbnailError("The image has too many pixels to thumbnail", too_large=True) from None
    except (UnidentifiedImageError, OSError, ValueError, SyntaxError, EOFError) as e:
        raise ThumbnailError(f"The content is not an image that can be read ({e})") from None
    if image.width * image.height > max_pixels:
        image.close()
        raise ThumbnailError(
            f"The image is {image.width}x{image.height}, more than the {max_pixels} pixels"
            " this server thumbnails",
            too_large=True,
        )
    return image


def _target_size(source: tuple[int, int], width: int, height: int, method: str) -> tuple[int, int]:
    """The thumbnail's size, never larger than the source."""
    sw, sh = source
    if method == "scale":
        ratio = min(width / sw, height / sh, 1.0)
        return max(1, round(sw * ratio)), max(1, round(sh * ratio))
    shrink = min(1.0, sw / width, sh / height)
    return max(1, round(width * shrink)), max(1, round(height * shrink))


def _resize(frame: Image.Image, size: tuple[int, int], method: str) -> Image.Image:
    if method == "scale":
        return frame.resize(size, Image.Resampling.LANCZOS, reducing_gap=3.0)
    return ImageOps.fit(frame, size, Image.Resampling.LANCZOS)


def _static(image: Image.Image, source_format: str | None) -> tuple[Image.Image, str]:
    """The frame to thumbnail, in a mode its output type can hold."""
    if source_format == "JPEG":
        return image.convert("RGB"), "image/jpeg"
    has_alpha = image.mode in ("RGBA", "LA", "PA") or "transparency" in image.info
    return image.convert("RGBA" if has_alpha else "RGB"), "image/png"


def _encode(image: Image.Image, media_type: str, **options: Any) -> bytes:
    out = io.BytesIO()
    if media_type == "image/jpeg":
        image.save(out, "JPEG", quality=_JPEG_QUALITY)
    elif media_type == "image/png":
        image.save(out, "PNG")
    else:
        image.save(out, "WEBP", **options)
    return out.getvalue()


def make_thumbnail(
    path: str,
    width: int,
    height: int,
    method: str,
    animated: bool,
    max_pixels: int,
    max_frames: int,
) -> Thumbnail:
    """A thumbnail of the image at ``path`` (see the module docstring), or a
    :class:`ThumbnailError` saying why not."""
    image = _open(path, max_pixels)
    try:
        source_format = image.format
        if animated and getattr(image, "is_animated", False):
            return _animated(image, width, height, method, max_frames)
        if source_format == "JPEG":
            # Decode at 1/2, 1/4 or 1/8 scale when that is still large enough.
            longest = max(width, height)
            image.draft("RGB", (longest, longest))
        try:
            upright = ImageOps.exif_transpose(image)
        except (OSError, ValueError, SyntaxError, EOFError) as e:
            raise ThumbnailError(f"The image could not be decoded ({e})") from None
        frame, media_type = _static(upright, source_format)
        size = _target_size(frame.size, width, height, method)
        thumbnail = _resize(frame, size, method)
        return Thumbnail(_encode(thumbnail, media_type), media_type, *thumbnail.size)
    except (OSError, ValueError, SyntaxError, EOFError) as e:
        raise ThumbnailError(f"The image could not be decoded ({e})") from None
    finally:
        image.close()


def _animated(
    image: Image.Image, width: int, height: int, method: str, max_frames: int
) -> Thumbnail:
    size = _target_size(image.size, width, height, method)
    frames: list[Image.Image] = []
    durations: list[int] = []
    for frame in ImageSequence.Iterator(image):
        if len(frames) >= max_frames:
            break
        durations.append(int(frame.info.get("duration", 100)) or 100)
        frames.append(_resize(frame.convert("RGBA"), size, method))
    data = _encode(
        frames[0],
        "image/webp",
        save_all=True,
        append_images=frames[1:],
        duration=durations,
        loop=0,
        quality=_JPEG_QUALITY,
    )
    return Thumbnail(data, "image/webp", *size)
