"""A hospital's DICOM images, decoded to the uint8 pixels the training code uses.

Hospitals export images from their PACS as DICOM; the federation trains on uint8 arrays,
``(H, W)`` for grey and ``(H, W, 3)`` for RGB. ``read_dicom`` gets from one to the other with
pydicom's own functions, in this order, and refuses a file it cannot use with a
:class:`DicomError` whose ``detail`` names the file and what was expected (its public text, which
may leave the hospital, names the problem only):

1. **Read** the file with ``pydicom.dcmread`` (a DICOM file has the ``DICM`` marker at byte 128);
   it must have a *Pixel Data* element.
2. **Transfer syntax**: compressed pixel data needs a decoding plugin; when pydicom has none for
   the file's transfer syntax the error names the syntax and says to
   ``pip install 'hospitrust[dicom]'`` (pylibjpeg and pylibjpeg-libjpeg: JPEG baseline, extended,
   lossless and JPEG-LS; pydicom itself decodes RLE Lossless, Pillow decodes JPEG 2000).
3. **Bits**: *Bits Stored* up to 16.
4. **Frames**: a multi-frame file is refused unless a frame is chosen (the task's
   ``dicom-frame``, 0-based); only that frame is decoded.
5. **Colour**: MONOCHROME1, MONOCHROME2 and RGB are read as they are; YBR_FULL and YBR_FULL_422
   are converted to RGB by pydicom's decoder (``convert_color_space``); YBR_ICT / YBR_RCT (JPEG
   2000) come out of the JPEG 2000 decoders as RGB; PALETTE COLOR goes through
   ``apply_color_lut``. Anything else is refused.
6. **Grey to uint8**: ``apply_modality_lut`` (*Rescale Slope/Intercept* or a *Modality LUT
   Sequence*), then ``apply_voi_lut`` (the *VOI LUT Sequence* if there is one, else the first
   *Window Center/Width*), then one linear map to 0..255 (see :func:`read_dicom` for the exact
   rules). An unsigned 8-bit image with no rescale and no window is returned unchanged, so that
   ``read_dicom(write_dicom(x)) == x``.
7. **MONOCHROME1** (0 is white) is inverted after the uint8 map: ``255 - x``.
8. **RGB**: 8-bit as it is; more bits shifted down to 8 (``x >> (BitsStored - 8)``).

Every rounding to uint8 is ``floor(v + 0.5)`` (half up, as pydicom's colour conversion rounds),
clipped to 0..255.

``write_dicom`` writes the opposite way: a minimal secondary-capture file of uint8 pixels,
for exporting test federations.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
import pydicom
from pydicom.dataset import Dataset, FileDataset, FileMetaDataset
from pydicom.pixels import (
    apply_color_lut,
    apply_modality_lut,
    apply_voi,
    apply_voi_lut,
    as_pixel_options,
    convert_color_space,
    get_decoder,
)
from pydicom.uid import (
    PYDICOM_IMPLEMENTATION_UID,
    UID,
    ExplicitVRLittleEndian,
    JPEG2000TransferSyntaxes,
    SecondaryCaptureImageStorage,
    generate_uid,
)

from hospitrust.errors import HospitalError

DICOM_SUFFIXES = (".dcm", ".dicom")
MAX_BITS_STORED = 16
INSTALL_HINT = "pip install 'hospitrust[dicom]'"

# what the decoded pixels may be; YBR_* are turned into RGB while decoding
_GREY = ("MONOCHROME1", "MONOCHROME2")
_SUPPORTED = (*_GREY, "RGB", "YBR_FULL", "YBR_FULL_422", "PALETTE COLOR")
# what a DicomError's public text says (no header value: the interpretation itself stays local)
UNSUPPORTED_PHOTOMETRIC = f"an unsupported photometric interpretation (supported: {', '.join(_SUPPORTED)})"
UNDECODABLE = "pixel data that could not be decoded"
# JPEG 2000's colour transforms, which the JPEG 2000 decoders (Pillow, pylibjpeg-openjpeg, GDCM) undo themselves
_J2K_COLOUR = ("YBR_ICT", "YBR_RCT")


class DicomError(HospitalError, ValueError):
    """A DICOM file the federation cannot use: ``public`` names the problem only (no path, no header
    value: it may leave the hospital), ``detail`` names the file and what was expected.
    """


def is_dicom(path: Path) -> bool:
    """Tell whether ``path`` is a DICOM file.

    True for a file with a ``.dcm``/``.dicom`` suffix (any case), or a file with the ``DICM``
    marker at byte 128 (files without a suffix, as PACS exports them).

    Parameters
    ----------
    path : Path
        The file to look at.

    Returns
    -------
    bool
        Whether the file is (by its name or its marker) a DICOM file; False for a folder or a
        missing file.
    """
    path = Path(path)
    if not path.is_file():
        return False
    if path.suffix.lower() in DICOM_SUFFIXES:
        return True
    try:
        with path.open("rb") as f:
            head = f.read(132)
    except OSError:
        return False
    return len(head) == 132 and head[128:132] == b"DICM"


def read_dicom(path: Path, *, frame: int | None = None) -> np.ndarray:
    """Decode one DICOM file to display-ready uint8: (H, W) for grey, (H, W, 3) for RGB.

    The uint8 map of a grey image, after ``apply_modality_lut`` (values ``x``) and
    ``apply_voi_lut`` (values ``y``):

    * **Window** (*Window Center* ``c``, *Window Width* ``w``; the first pair if several):
      pydicom's ``apply_windowing`` puts out ``y`` in ``[y_min, y_max]``, the range of the stored
      bit depth (``0 .. 2**BitsStored - 1`` unsigned, ``-2**(BitsStored-1) .. 2**(BitsStored-1) - 1``
      signed; ``0 .. 2**n - 1`` for a Modality LUT of ``n``-bit entries) passed through the
      rescale (``* slope + intercept``). That range is mapped linearly onto 0..255:
      ``round((y - y_min) / (y_max - y_min) * 255)``. For the default LINEAR function this is
      DICOM's window with output range 0..255: 0 where ``x <= c - 0.5 - (w - 1) / 2``, 255 where
      ``x > c - 0.5 + (w - 1) / 2``, else ``round(((x - (c - 0.5)) / (w - 1) + 0.5) * 255)``.
      LINEAR_EXACT and SIGMOID map the same way from their own output.
    * **VOI LUT Sequence** (taking precedence over a window, as pydicom does): the LUT's
      entries ``y`` are mapped from the range of the LUT's own entries,
      ``round((y - min(LUT)) / (max(LUT) - min(LUT)) * 255)`` (the declared entry depth is often
      16 for 12-bit data, so the entries' own range is what the image uses); a constant LUT
      gives zeros. Float modality output is rounded to integers before the lookup.
    * **Neither**: min-max scale of the image, ``round((x - min) / (max - min) * 255)``; a
      constant image gives zeros. Exception: an unsigned 8-bit image (``BitsStored == 8``,
      ``PixelRepresentation == 0``) with no rescale (absent, or slope 1 and intercept 0) and no
      Modality LUT is returned unchanged, without a stretch (what :func:`write_dicom` writes).

    ``round(v)`` is ``floor(v + 0.5)``, clipped to 0..255. MONOCHROME1 is then inverted
    (``255 - v``). RGB: 8-bit as is, ``x >> (BitsStored - 8)`` above 8 bits,
    ``x << (8 - BitsStored)`` below. PALETTE COLOR: the palette's RGB, 16-bit entries ``>> 8``.

    Parameters
    ----------
    path : Path
        The DICOM file.
    frame : int or None, optional
        For a multi-frame file, the 0-based frame to take (the task's ``dicom-frame``); a
        multi-frame file without it is refused. Frame 0 of a single-frame file is its image.

    Returns
    -------
    numpy.ndarray
        uint8 pixels, (H, W) for grey (MONOCHROME1/2) and (H, W, 3) for colour.

    Raises
    ------
    DicomError
        Not a DICOM file or unreadable; no pixel data; a compressed transfer syntax with no
        decoder installed; more than 16 bits stored; multi-frame without ``frame`` or
        ``frame`` out of range; an unsupported photometric interpretation; pixel data that
        does not decode.
    """
    path = Path(path)
    ds = _read(path)
    tsyntax = _transfer_syntax(path, ds)
    decoder = _decoder(path, tsyntax)
    bits = _bits_stored(path, ds)
    index = _frame_index(path, ds, frame)
    photometric = _photometric(path, ds, tsyntax)

    try:
        # Decoder.as_array is what pydicom.pixels.pixel_array runs; it also returns the pixels'
        # properties after decoding (a YBR image is RGB by then), so nothing has to be guessed
        arr, props = decoder.as_array(ds, index=index, validate=True, raw=False, **as_pixel_options(ds, as_rgb=True))
    except RuntimeError as exc:
        if "missing dependencies" in str(exc):  # pydicom's words when no plugin can decode the syntax
            raise _missing_decoder(path, tsyntax, decoder) from exc
        raise DicomError(UNDECODABLE, f"{path}: pixel data in {_syntax_name(tsyntax)} could not be decoded: {exc}") from exc
    except Exception as exc:  # pydicom and its plugins raise many kinds on corrupt pixel data
        raise DicomError(UNDECODABLE, f"{path}: pixel data in {_syntax_name(tsyntax)} could not be decoded: {exc}") from exc

    decoded = str(props.get("photometric_interpretation", photometric))
    if decoded in ("YBR_FULL", "YBR_FULL_422"):  # only if a decoder left it in YCbCr
        arr = convert_color_space(arr, "YBR_FULL", "RGB")
        decoded = "RGB"

    if decoded in _GREY:
        out = _grey_to_uint8(path, arr, ds, bits)
        # MONOCHROME1: 0 is white; invert after the map so that the window keeps its meaning
        return (255 - out).astype(np.uint8) if decoded == "MONOCHROME1" else out
    if decoded == "RGB":
        return _rgb_to_uint8(arr, int(props.get("bits_stored", bits)))
    if decoded == "PALETTE COLOR":
        try:
            rgb = apply_color_lut(arr, ds)
        except Exception as exc:  # a missing or malformed palette
            raise DicomError("a PALETTE COLOR image whose palette cannot be applied",
                             f"{path}: PALETTE COLOR image whose palette cannot be applied: {exc}") from exc
        return (rgb >> 8).astype(np.uint8) if rgb.dtype.itemsize > 1 else rgb.astype(np.uint8)
    raise DicomError(UNSUPPORTED_PHOTOMETRIC,
                     f"{path}: photometric interpretation {decoded!r} after decoding; supported: {', '.join(_SUPPORTED)}")


def write_dicom(path: Path, pixels: np.ndarray, *, patient_id: str, label: str | None = None, bits: int = 8) -> None:
    """Write a minimal valid secondary-capture DICOM of uint8 pixels, for exporting test federations.

    Uncompressed, Explicit VR Little Endian; (H, W) is written MONOCHROME2 and (H, W, 3) RGB.
    ``read_dicom(path)`` gives ``pixels`` back exactly. With ``bits`` above 8 the values are
    stored as ``x << (bits - 8)`` in 16-bit words (*Bits Stored* ``bits``): RGB reads back by the
    shift, and a grey image carries the window (center ``0.5 + 255 * 2**(bits-8) / 2``, width
    ``255 * 2**(bits-8) + 1``) whose LINEAR function maps ``x << (bits - 8)`` back onto ``x``.

    Parameters
    ----------
    path : Path
        The file to write (its folder must exist).
    pixels : numpy.ndarray
        uint8 pixels, (H, W) grey or (H, W, 3) RGB.
    patient_id : str
        The *Patient ID* (also written as *Patient Name*).
    label : str or None, optional
        The image's class label, written as *Image Comments* (0020,4000) when given.
    bits : int, optional
        *Bits Stored*, 8 (default) to 16.

    Raises
    ------
    ValueError
        ``pixels`` not uint8 (H, W) or (H, W, 3), ``bits`` outside 8..16, or an empty ``patient_id``.
    """
    pixels = np.asarray(pixels)
    if pixels.dtype != np.uint8:
        raise ValueError(f"write_dicom takes uint8 pixels, got {pixels.dtype}")
    if not (pixels.ndim == 2 or (pixels.ndim == 3 and pixels.shape[2] == 3)) or 0 in pixels.shape:
        raise ValueError(f"write_dicom takes (H, W) grey or (H, W, 3) RGB pixels, got shape {pixels.shape}")
    if not 8 <= bits <= MAX_BITS_STORED:
        raise ValueError(f"write_dicom stores 8 to {MAX_BITS_STORED} bits, got bits={bits}")
    if not patient_id:
        raise ValueError("write_dicom needs a patient_id")

    sop_uid = generate_uid()
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = SecondaryCaptureImageStorage
    meta.MediaStorageSOPInstanceUID = sop_uid
    meta.TransferSyntaxUID = ExplicitVRLittleEndian
    meta.ImplementationClassUID = PYDICOM_IMPLEMENTATION_UID
    ds = FileDataset(str(path), {}, file_meta=meta, preamble=b"\0" * 128)
    # SC Image IOD: Patient, General Study, General Series, SC Equipment, General Image, Image Pixel, SOP Common
    ds.SOPClassUID = SecondaryCaptureImageStorage
    ds.SOPInstanceUID = sop_uid
    ds.PatientID = patient_id
    ds.PatientName = patient_id
    ds.PatientBirthDate = ""
    ds.PatientSex = ""
    ds.StudyInstanceUID = generate_uid()
    ds.StudyDate = ""
    ds.StudyTime = ""
    ds.ReferringPhysicianName = ""
    ds.StudyID = ""
    ds.AccessionNumber = ""
    ds.SeriesInstanceUID = generate_uid()
    ds.Modality = "OT"
    ds.SeriesNumber = 1
    ds.ConversionType = "WSD"  # workstation: a derived image, not from a modality
    ds.InstanceNumber = 1
    ds.PatientOrientation = ""
    if label is not None:
        ds.ImageComments = label

    shift = bits - 8
    stored = pixels if shift == 0 else pixels.astype(np.uint16) << shift
    rgb = pixels.ndim == 3
    ds.set_pixel_data(stored, "RGB" if rgb else "MONOCHROME2", bits, generate_instance_uid=False)
    if shift and not rgb:
        # LINEAR window: ((s - (c - 0.5)) / (w - 1) + 0.5) * 255 == s >> shift for s = x << shift
        span = 255 * 2**shift
        ds.WindowCenter = str(0.5 + span / 2)
        ds.WindowWidth = f"{span + 1}"
    ds.save_as(path, enforce_file_format=True)


def _read(path: Path) -> Dataset:
    try:
        ds = pydicom.dcmread(path)
    except Exception as exc:  # pydicom raises InvalidDicomError, OSError, EOFError, struct.error, ... on bad files
        raise DicomError("not a readable DICOM file", f"{path}: not a readable DICOM file (expected the 'DICM' marker at "
                         f"byte 128 and a valid dataset): {exc}") from exc
    if "PixelData" not in ds:
        other = [kw for kw in ("FloatPixelData", "DoubleFloatPixelData") if kw in ds]
        what = f"only {' and '.join(other)}, which the federation does not read" if other else f"no (7FE0,0010) Pixel Data element; SOP class {_sop_class(ds)}"
        raise DicomError("a DICOM file without pixel data", f"{path}: no pixel data ({what}); expected an image")
    return ds


def _sop_class(ds: Dataset) -> str:
    uid = ds.get("SOPClassUID")
    return f"{UID(str(uid)).name} ({uid})" if uid else "not given"


def _transfer_syntax(path: Path, ds: Dataset) -> UID:
    tsyntax = getattr(ds, "file_meta", Dataset()).get("TransferSyntaxUID")
    if not tsyntax:
        raise DicomError("no Transfer Syntax UID in the file meta information",
                         f"{path}: no (0002,0010) Transfer Syntax UID in the file meta information; expected a DICOM Part 10 file")
    return UID(str(tsyntax))


def _syntax_name(tsyntax: UID) -> str:
    return f"transfer syntax {tsyntax.name} ({tsyntax})" if tsyntax.name != str(tsyntax) else f"transfer syntax {tsyntax}"


def _decoder(path: Path, tsyntax: UID) -> Any:
    try:
        decoder = get_decoder(tsyntax)
    except NotImplementedError as exc:
        raise DicomError("pixel data in a transfer syntax pydicom cannot decode",
                         f"{path}: pixel data in {_syntax_name(tsyntax)}, which pydicom cannot decode") from exc
    # a compressed syntax needs a plugin; pydicom knows which ones are installed
    if decoder.is_encapsulated and not decoder.is_available:
        raise _missing_decoder(path, tsyntax, decoder)
    return decoder


def _missing_decoder(path: Path, tsyntax: UID, decoder: Any) -> DicomError:
    needs = "; ".join(decoder.missing_dependencies) or "a decoding plugin"
    return DicomError(f"compressed pixel data and no decoder for it installed (run {INSTALL_HINT})",
                      f"{path}: pixel data compressed in {_syntax_name(tsyntax)} and no decoder for it is installed ({needs}); run {INSTALL_HINT}")


def _bits_stored(path: Path, ds: Dataset) -> int:
    bits = ds.get("BitsStored")
    if bits is None:
        raise DicomError("no Bits Stored", f"{path}: no (0028,0101) Bits Stored; expected 1 to {MAX_BITS_STORED}")
    if int(bits) > MAX_BITS_STORED:
        raise DicomError(f"more than {MAX_BITS_STORED} bits stored",
                         f"{path}: {int(bits)}-bit pixels (Bits Stored {int(bits)}); the federation reads up to {MAX_BITS_STORED} bits")
    return int(bits)


def _frame_index(path: Path, ds: Dataset, frame: int | None) -> int | None:
    raw = ds.get("NumberOfFrames")
    n = int(raw) if raw not in (None, "") else 1
    n = max(n, 1)  # 0 is sometimes written for a single frame
    if frame is None:
        if n > 1:
            raise DicomError("a multi-frame file and no dicom-frame in the task",
                             f"{path}: multi-frame ({n} frames); set the task's dicom-frame to choose one (0 to {n - 1})")
        return None
    if not 0 <= frame < n:
        raise DicomError(f"dicom-frame {frame} is out of the file's range of frames",
                         f"{path}: dicom-frame {frame} is out of range; the file has {n} frame(s), 0 to {n - 1}")
    return frame


def _photometric(path: Path, ds: Dataset, tsyntax: UID) -> str:
    photometric = str(ds.get("PhotometricInterpretation", "")).strip().upper()
    if photometric in _SUPPORTED or (photometric in _J2K_COLOUR and tsyntax in JPEG2000TransferSyntaxes):
        return photometric
    raise DicomError(UNSUPPORTED_PHOTOMETRIC,
                     f"{path}: photometric interpretation {photometric or 'missing'!r}; supported: {', '.join(_SUPPORTED)}")


def _round_uint8(values: np.ndarray) -> np.ndarray:
    return np.clip(np.floor(values + 0.5), 0, 255).astype(np.uint8)


def _scale(values: np.ndarray, lo: float, hi: float) -> np.ndarray:
    """``round((values - lo) / (hi - lo) * 255)``; zeros when the range is empty."""
    if hi == lo:
        return np.zeros(values.shape, dtype=np.uint8)
    return _round_uint8((values.astype(np.float64) - lo) / (hi - lo) * 255.0)


def _has(ds: Dataset, keyword: str) -> bool:
    return ds.get(keyword) not in (None, "")


def _grey_to_uint8(path: Path, arr: np.ndarray, ds: Dataset, bits: int) -> np.ndarray:
    for keyword in ("RescaleSlope", "RescaleIntercept"):
        if keyword in ds and not _has(ds, keyword):
            del ds[keyword]  # an empty value is invalid; pydicom would fail on it, so treat it as absent
    rescale = _has(ds, "RescaleSlope") and _has(ds, "RescaleIntercept")
    identity = not rescale or (float(ds.RescaleSlope) == 1.0 and float(ds.RescaleIntercept) == 0.0)
    modality_lut = bool(ds.get("ModalityLUTSequence"))
    # the same tests pydicom's apply_voi_lut makes to choose between the LUT and the window
    voi_item = ds.VOILUTSequence[0] if ds.get("VOILUTSequence") else None
    voi_lut = voi_item is not None and _has(voi_item, "LUTDescriptor") and _has(voi_item, "LUTData")
    window = not voi_lut and _has(ds, "WindowCenter") and _has(ds, "WindowWidth")

    if bits == 8 and int(ds.get("PixelRepresentation", 0)) == 0 and identity and not modality_lut and not (voi_lut or window):
        # unsigned 8-bit with nothing to apply: already display values (write_dicom's files); no stretch
        return arr.astype(np.uint8)

    try:
        values = apply_modality_lut(arr, ds)
        if voi_lut:
            if not np.issubdtype(values.dtype, np.integer):
                values = np.floor(values + 0.5).astype(np.int64)  # LUT indices are integers
            out = apply_voi_lut(values, ds, index=0)
            lut = _voi_lut_entries(ds)
            return _scale(out, float(lut.min()), float(lut.max()))
        if window:
            out = apply_voi_lut(values, ds, index=0)
            y_min, y_max = _window_output_range(ds)
            return _scale(out, y_min, y_max)
    except DicomError:
        raise
    except Exception as exc:  # malformed LUTs or window values
        raise DicomError("the modality LUT / VOI LUT / window cannot be applied",
                         f"{path}: the modality LUT / VOI LUT / window cannot be applied: {exc}") from exc
    return _scale(values, float(values.min()), float(values.max()))


def _voi_lut_entries(ds: Dataset) -> np.ndarray:
    """Every entry of the first VOI LUT, read by pydicom's own ``apply_voi`` over the LUT's input range."""
    nr_entries, first_map = (int(v) for v in ds.VOILUTSequence[0].LUTDescriptor[:2])
    nr_entries = nr_entries or 2**16
    return np.asarray(apply_voi(np.arange(first_map, first_map + nr_entries, dtype=np.int64), ds, index=0))


def _window_output_range(ds: Dataset) -> tuple[float, float]:
    """The ``[y_min, y_max]`` that pydicom's ``apply_windowing`` maps a window onto (pydicom 3.0)."""
    y_min: float
    y_max: float
    if ds.get("ModalityLUTSequence"):
        y_min, y_max = 0, 2 ** int(ds.ModalityLUTSequence[0].LUTDescriptor[2]) - 1
    elif int(ds.PixelRepresentation) == 0:
        y_min, y_max = 0, 2 ** int(ds.BitsStored) - 1
    else:
        y_min, y_max = -(2 ** (int(ds.BitsStored) - 1)), 2 ** (int(ds.BitsStored) - 1) - 1
    if ds.get("RescaleSlope") is not None and ds.get("RescaleIntercept") is not None:
        slope, intercept = float(ds.RescaleSlope), float(ds.RescaleIntercept)
        y_min, y_max = y_min * slope + intercept, y_max * slope + intercept
    return float(y_min), float(y_max)


def _rgb_to_uint8(arr: np.ndarray, bits: int) -> np.ndarray:
    if bits > 8:
        return (arr >> (bits - 8)).astype(np.uint8)
    if bits < 8:
        return (arr.astype(np.uint16) << (8 - bits)).astype(np.uint8)  # fill the 8-bit range
    return arr.astype(np.uint8)
