"""DICOM -> uint8: hand-computed pixels from small files built tag by tag with pydicom.

Every expected array is worked out in the test from the DICOM formulas (numbers shown), not by
the code under test. Rounding is half up: round(v) = floor(v + 0.5).
"""

from __future__ import annotations

import contextlib
import io
import re
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pydicom
import pytest
from PIL import Image
from pydicom.dataset import Dataset, FileDataset, FileMetaDataset
from pydicom.encaps import encapsulate
from pydicom.pixels import convert_color_space, get_decoder
from pydicom.tag import Tag
from pydicom.uid import (
    ExplicitVRLittleEndian,
    JPEGBaseline8Bit,
    MPEG2MPML,
    RLELossless,
    SecondaryCaptureImageStorage,
    generate_uid,
)

from hospitrust.datasets.dicom import DicomError, is_dicom, read_dicom, write_dicom

U8 = np.uint8


@contextlib.contextmanager
def refused(pattern: str, path: Path) -> Iterator[Any]:
    """read_dicom refuses the file: its detail (the hospital's own log) matches ``pattern`` and names the
    file; its public text (what may leave the hospital) names neither the file nor its folder.
    """
    with pytest.raises(DicomError) as err:
        yield err
    assert re.search(pattern, err.value.detail), err.value.detail
    assert str(path) in err.value.detail
    assert path.name not in str(err.value) and str(path.parent) not in str(err.value), str(err.value)


def build(
    path: Path,
    stored: np.ndarray | None,
    *,
    bits_allocated: int,
    bits_stored: int,
    photometric: str = "MONOCHROME2",
    signed: bool = False,
    planar: int | None = None,
    frames: int | None = None,
    tsyntax: str = ExplicitVRLittleEndian,
    pixel_bytes: bytes | None = None,
    shape: tuple[int, int] | None = None,
    **tags: object,
) -> Path:
    """A DICOM file with every pixel-module tag set by hand; ``stored`` are the raw stored values.

    ``stored`` is (rows, cols), (rows, cols, 3) colour-by-pixel, or (frames, rows, cols) with
    ``frames``; ``pixel_bytes`` replaces its bytes (for encapsulated or hand-packed data).
    """
    meta = FileMetaDataset()
    meta.MediaStorageSOPClassUID = SecondaryCaptureImageStorage
    meta.MediaStorageSOPInstanceUID = generate_uid()
    meta.TransferSyntaxUID = tsyntax
    ds = FileDataset(str(path), {}, file_meta=meta, preamble=b"\0" * 128)
    ds.SOPClassUID = SecondaryCaptureImageStorage
    ds.SOPInstanceUID = meta.MediaStorageSOPInstanceUID
    ds.PatientID = "h1-p1"
    ds.Modality = "OT"
    samples = 3 if photometric in ("RGB", "YBR_FULL", "YBR_FULL_422") else 1
    if stored is not None:
        rows, cols = stored.shape[1:3] if frames else stored.shape[:2]
    else:
        assert shape is not None
        rows, cols = shape
    ds.Rows, ds.Columns = rows, cols
    ds.SamplesPerPixel = samples
    ds.PhotometricInterpretation = photometric
    ds.BitsAllocated = bits_allocated
    ds.BitsStored = bits_stored
    ds.HighBit = bits_stored - 1
    ds.PixelRepresentation = 1 if signed else 0
    if samples > 1:
        ds.PlanarConfiguration = planar or 0
    if frames:
        ds.NumberOfFrames = frames
    for keyword, value in tags.items():
        setattr(ds, keyword, value)
    if pixel_bytes is None:
        assert stored is not None
        dtype = {8: "u1", 16: "u2", 32: "u4"}[bits_allocated]
        if signed:
            dtype = dtype.replace("u", "i")
        pixel_bytes = np.asarray(stored).astype("<" + dtype).tobytes()
    if len(pixel_bytes) % 2:
        pixel_bytes += b"\0"
    ds.PixelData = pixel_bytes
    ds["PixelData"].VR = "OB" if bits_allocated <= 8 or pydicom.uid.UID(tsyntax).is_compressed else "OW"
    if pydicom.uid.UID(tsyntax).is_compressed:
        ds["PixelData"].is_undefined_length = True
    ds.save_as(path, enforce_file_format=True)
    return path


# --- write_dicom / is_dicom -------------------------------------------------------------------


@pytest.mark.parametrize("bits", [8, 12, 16])
def test_write_read_round_trip_grey_is_exact(tmp_path: Path, bits: int) -> None:
    """write_dicom then read_dicom gives every uint8 grey value back, at 8, 12 and 16 bits stored."""
    x = np.arange(256, dtype=U8).reshape(16, 16)  # every uint8 value once
    path = tmp_path / "grey.dcm"
    write_dicom(path, x, patient_id="h1-p7", label="pneumonia", bits=bits)
    out = read_dicom(path)
    assert out.dtype == U8 and out.shape == (16, 16)
    np.testing.assert_array_equal(out, x)
    ds = pydicom.dcmread(path)
    assert ds.file_meta.TransferSyntaxUID == ExplicitVRLittleEndian
    assert ds.SOPClassUID == SecondaryCaptureImageStorage
    assert (ds.PatientID, ds.ImageComments, ds.PhotometricInterpretation) == ("h1-p7", "pneumonia", "MONOCHROME2")
    assert (ds.BitsAllocated, ds.BitsStored) == ((8, 8) if bits == 8 else (16, bits))
    if bits == 16:
        # stored as x << 8: value 3 is 768 on disk
        assert int(ds.pixel_array[0, 3]) == 768


def test_write_read_round_trip_rgb_is_exact(tmp_path: Path) -> None:
    """An RGB image comes back exactly, 8-bit and stored in 16 bits."""
    x = np.array([[[0, 1, 2], [255, 254, 253], [10, 20, 30]], [[128, 0, 255], [7, 7, 7], [200, 100, 50]]], dtype=U8)
    for bits in (8, 16):
        path = tmp_path / f"rgb{bits}.dcm"
        write_dicom(path, x, patient_id="h2-p1", bits=bits)
        out = read_dicom(path)
        assert out.dtype == U8 and out.shape == (2, 3, 3)
        np.testing.assert_array_equal(out, x)
        assert pydicom.dcmread(path).PhotometricInterpretation == "RGB"


def test_write_dicom_refuses_what_it_cannot_write(tmp_path: Path) -> None:
    """Non-uint8 pixels, a fourth channel or 17 bits are refused with the reason."""
    with pytest.raises(ValueError, match="uint8"):
        write_dicom(tmp_path / "a.dcm", np.zeros((2, 2), dtype=np.uint16), patient_id="p")
    with pytest.raises(ValueError, match="shape"):
        write_dicom(tmp_path / "a.dcm", np.zeros((2, 2, 4), dtype=U8), patient_id="p")
    with pytest.raises(ValueError, match="bits=17"):
        write_dicom(tmp_path / "a.dcm", np.zeros((2, 2), dtype=U8), patient_id="p", bits=17)


def test_is_dicom_by_marker_and_by_suffix(tmp_path: Path) -> None:
    """A suffix-less PACS export is found by its DICM marker; .dcm names count; folders and missing files do not."""
    pacs = tmp_path / "IM000001"  # no suffix, as PACS exports name them
    write_dicom(pacs, np.zeros((2, 3), dtype=U8), patient_id="p")
    assert pacs.read_bytes()[128:132] == b"DICM"
    assert is_dicom(pacs)
    text = tmp_path / "notes"
    text.write_bytes(b"x" * 200)
    assert not is_dicom(text)
    named = tmp_path / "scan.DCM"
    named.write_bytes(b"by its name")
    assert is_dicom(named)
    assert not is_dicom(tmp_path / "missing.dcm")
    (tmp_path / "folder.dcm").mkdir()
    assert not is_dicom(tmp_path / "folder.dcm")


# --- grey images ------------------------------------------------------------------------------


def test_monochrome1_8bit_is_inverted(tmp_path: Path) -> None:
    """MONOCHROME1 (0 is white) comes out as 255 - x."""
    stored = np.array([[0, 10, 200], [255, 128, 1]])
    path = build(tmp_path / "m1.dcm", stored, bits_allocated=8, bits_stored=8, photometric="MONOCHROME1")
    # 8-bit, no rescale, no window: taken as is, then 255 - x
    expected = np.array([[255 - 0, 255 - 10, 255 - 200], [255 - 255, 255 - 128, 255 - 1]], dtype=U8)
    assert expected.tolist() == [[255, 245, 55], [0, 127, 254]]
    np.testing.assert_array_equal(read_dicom(path), expected)


def test_monochrome1_16bit_min_max_then_inverted(tmp_path: Path) -> None:
    """MONOCHROME1 is inverted after the min-max map."""
    stored = np.array([[100, 500, 900], [300, 700, 100]])
    path = build(tmp_path / "m1.dcm", stored, bits_allocated=16, bits_stored=16, photometric="MONOCHROME1")
    # min-max over [100, 900]: (x - 100) / 800 * 255 -> 0, 127.5 -> 128, 255, 63.75 -> 64, 191.25 -> 191, 0
    # then inverted: 255 - v
    expected = np.array([[255, 127, 0], [191, 64, 255]], dtype=U8)
    np.testing.assert_array_equal(read_dicom(path), expected)


def test_12bit_in_16_with_rescale_and_window(tmp_path: Path) -> None:
    """12 bits in 16, rescaled by 2 and -1024, then DICOM's LINEAR window onto 0..255."""
    stored = np.array([[0, 400, 432], [500, 532, 600], [631, 632, 4095]])
    path = build(
        tmp_path / "ct.dcm",
        stored,
        bits_allocated=16,
        bits_stored=12,
        RescaleSlope=2,
        RescaleIntercept=-1024,
        WindowCenter=40,
        WindowWidth=400,
    )
    # x = 2 * s - 1024:           -1024, -224, -160,  -24, 40, 176,  238, 240, 7166
    # LINEAR window, c = 40, w = 400: c - 0.5 = 39.5, w - 1 = 399
    #   x <= 39.5 - 199.5 = -160 -> 0;  x > 39.5 + 199.5 = 239 -> 255
    #   else ((x - 39.5) / 399 + 0.5) * 255:
    #     -24: (-63.5 / 399 + 0.5) * 255 =  86.92 ->  87
    #      40: (  0.5 / 399 + 0.5) * 255 = 127.82 -> 128
    #     176: (136.5 / 399 + 0.5) * 255 = 214.74 -> 215
    #     238: (198.5 / 399 + 0.5) * 255 = 254.36 -> 254
    # (pydicom's output range is y_min..y_max = 0 * 2 - 1024 .. 4095 * 2 - 1024, mapped onto 0..255)
    expected = np.array([[0, 0, 0], [87, 128, 215], [254, 255, 255]], dtype=U8)
    np.testing.assert_array_equal(read_dicom(path), expected)


def test_first_of_several_windows_is_used(tmp_path: Path) -> None:
    """With several windows the first center/width pair applies."""
    stored = np.array([[0, 100, 150, 200, 255]])
    path = build(tmp_path / "w.dcm", stored, bits_allocated=8, bits_stored=8, WindowCenter=[128, 50], WindowWidth=[101, 10])
    # c = 128, w = 101: c - 0.5 = 127.5, w - 1 = 100; x <= 77.5 -> 0, x > 177.5 -> 255
    #   100: (-27.5 / 100 + 0.5) * 255 = 57.375 -> 57;  150: (22.5 / 100 + 0.5) * 255 = 184.875 -> 185
    expected = np.array([[0, 57, 185, 255, 255]], dtype=U8)
    np.testing.assert_array_equal(read_dicom(path), expected)


def test_16bit_without_window_is_min_max_scaled(tmp_path: Path) -> None:
    """16-bit without a window: min-max over the image."""
    stored = np.array([[1000, 1100, 1400], [2000, 5000, 65535]])
    path = build(tmp_path / "mr.dcm", stored, bits_allocated=16, bits_stored=16)
    # (x - 1000) / 64535 * 255: 1100 -> 0.395 -> 0; 1400 -> 1.581 -> 2; 2000 -> 3.951 -> 4; 5000 -> 15.806 -> 16
    expected = np.array([[0, 0, 2], [4, 16, 255]], dtype=U8)
    np.testing.assert_array_equal(read_dicom(path), expected)


def test_constant_image_without_window_is_zeros(tmp_path: Path) -> None:
    """A constant image has no range to stretch: all zeros."""
    path = build(tmp_path / "c.dcm", np.full((2, 3), 700), bits_allocated=16, bits_stored=12)
    np.testing.assert_array_equal(read_dicom(path), np.zeros((2, 3), dtype=U8))


def test_8bit_with_rescale_is_stretched_not_passed_through(tmp_path: Path) -> None:
    """An 8-bit image with a rescale is not taken as is."""
    stored = np.array([[10, 20, 30]])
    path = build(tmp_path / "r.dcm", stored, bits_allocated=8, bits_stored=8, RescaleSlope=1, RescaleIntercept=5)
    # a rescale leaves the as-is rule: x = s + 5 = 15, 25, 35 -> min-max: 0, 127.5 -> 128, 255
    np.testing.assert_array_equal(read_dicom(path), np.array([[0, 128, 255]], dtype=U8))


def test_signed_pixels_min_max(tmp_path: Path) -> None:
    """Signed 16-bit pixels (PixelRepresentation 1) are min-max scaled from their negative minimum."""
    stored = np.array([[-1000, -500, 0], [250, 1000, 1000]])
    path = build(tmp_path / "s.dcm", stored, bits_allocated=16, bits_stored=16, signed=True)
    # (x + 1000) / 2000 * 255: -500 -> 63.75 -> 64; 0 -> 127.5 -> 128; 250 -> 159.375 -> 159
    expected = np.array([[0, 64, 128], [159, 255, 255]], dtype=U8)
    np.testing.assert_array_equal(read_dicom(path), expected)


def test_signed_12bit_two_complement_with_window(tmp_path: Path) -> None:
    """Signed 12-bit two's complement in 16-bit words, unused bits ignored, windowed."""
    values = [-2000, -50, -49, 0, 25, 49, 50]
    # 12-bit two's complement in 16-bit words, upper 4 bits not sign-extended (and one with junk in them)
    words = [v & 0xFFF for v in values]
    words[3] |= 0xF000
    raw = np.array(words, dtype="<u2").tobytes()
    path = build(tmp_path / "s12.dcm", None, shape=(1, 7), pixel_bytes=raw, bits_allocated=16, bits_stored=12, signed=True, WindowCenter=0, WindowWidth=100)
    # c - 0.5 = -0.5, w - 1 = 99: x <= -50 -> 0, x > 49 -> 255
    #   -49: (-48.5 / 99 + 0.5) * 255 = 2.576 -> 3;  0: (0.5 / 99 + 0.5) * 255 = 128.79 -> 129
    #    25: (25.5 / 99 + 0.5) * 255 = 193.18 -> 193; 49: (49.5 / 99 + 0.5) * 255 = 255
    expected = np.array([[0, 0, 3, 129, 193, 255, 255]], dtype=U8)
    np.testing.assert_array_equal(read_dicom(path), expected)


def _voi_lut_item(descriptor: list[int], data: list[int]) -> Dataset:
    item = Dataset()
    item.add_new(0x00283002, "US", descriptor)  # LUT Descriptor: entries, first mapped value, bits
    item.add_new(0x00283006, "US", data)  # LUT Data
    return item


def test_voi_lut_sequence_takes_precedence_over_window(tmp_path: Path) -> None:
    """A VOI LUT Sequence wins over Window Center/Width, and its entries' range maps onto 0..255."""
    stored = np.array([[5, 10, 11], [12, 13, 50]])
    path = build(
        tmp_path / "lut.dcm",
        stored,
        bits_allocated=16,
        bits_stored=12,
        WindowCenter=2048,
        WindowWidth=10,  # would make almost everything 0 or 255
        VOILUTSequence=[_voi_lut_item([4, 10, 16], [100, 1100, 3100, 4100])],
    )
    # LUT index = s - 10, clipped to 0..3: 5 -> 0, 10 -> 0, 11 -> 1, 12 -> 2, 13 -> 3, 50 -> 3
    # LUT values:                          100, 100, 1100, 3100, 4100, 4100
    # mapped from the LUT's range [100, 4100]: (v - 100) / 4000 * 255 -> 0, 0, 63.75 -> 64, 191.25 -> 191, 255, 255
    expected = np.array([[0, 0, 64], [191, 255, 255]], dtype=U8)
    np.testing.assert_array_equal(read_dicom(path), expected)


def test_modality_lut_sequence_then_window(tmp_path: Path) -> None:
    """A Modality LUT Sequence, then the window over pydicom's Modality LUT output range."""
    modality = Dataset()
    modality.add_new(0x00283002, "US", [4, 0, 16])  # 4 entries from 0, 16-bit entries (8 or 16 per PS3.3 C.11.1.1)
    modality.add_new(0x00283006, "US", [0, 1000, 2000, 4095])
    modality.ModalityLUTType = "US"
    stored = np.array([[0, 1, 2, 3]])
    path = build(tmp_path / "mlut.dcm", stored, bits_allocated=8, bits_stored=8, ModalityLUTSequence=[modality], WindowCenter=1500, WindowWidth=2001)
    # modality LUT: 0, 1000, 2000, 4095; window c - 0.5 = 1499.5, w - 1 = 2000: x <= 499.5 -> 0, x > 2499.5 -> 255
    #   1000: (-499.5 / 2000 + 0.5) * 255 = 63.82 -> 64;  2000: (500.5 / 2000 + 0.5) * 255 = 191.31 -> 191
    # (pydicom's y range with a Modality LUT: 0 .. 2**16 - 1, mapped onto 0..255)
    np.testing.assert_array_equal(read_dicom(path), np.array([[0, 64, 191, 255]], dtype=U8))


# --- colour -----------------------------------------------------------------------------------


def test_rgb_8bit_as_is_both_planar_configurations(tmp_path: Path) -> None:
    """8-bit RGB is returned as it is, colour-by-pixel or colour-by-plane."""
    rgb = np.array([[[255, 0, 0], [0, 255, 0], [0, 0, 255]], [[1, 2, 3], [40, 50, 60], [250, 128, 7]]], dtype=U8)
    by_pixel = build(tmp_path / "p0.dcm", rgb, bits_allocated=8, bits_stored=8, photometric="RGB", planar=0)
    np.testing.assert_array_equal(read_dicom(by_pixel), rgb)
    # planar configuration 1: all R, then all G, then all B
    planes = bytes(rgb[..., 0].ravel()) + bytes(rgb[..., 1].ravel()) + bytes(rgb[..., 2].ravel())
    by_plane = build(tmp_path / "p1.dcm", rgb, pixel_bytes=planes, bits_allocated=8, bits_stored=8, photometric="RGB", planar=1)
    out = read_dicom(by_plane)
    assert out.shape == (2, 3, 3) and out.dtype == U8
    np.testing.assert_array_equal(out, rgb)


def test_rgb_12bit_is_shifted_to_8(tmp_path: Path) -> None:
    """RGB with 12 bits stored is shifted down by 4."""
    stored = np.array([[[4095, 0, 16], [2048, 15, 17]]])
    path = build(tmp_path / "rgb12.dcm", stored, bits_allocated=16, bits_stored=12, photometric="RGB")
    # x >> 4: 4095 -> 255, 0 -> 0, 16 -> 1, 2048 -> 128, 15 -> 0, 17 -> 1
    np.testing.assert_array_equal(read_dicom(path), np.array([[[255, 0, 1], [128, 0, 1]]], dtype=U8))


def test_ybr_full_is_converted_to_rgb(tmp_path: Path) -> None:
    """YBR_FULL becomes RGB, by hand for four pixels and as pydicom converts for all."""
    ybr = np.array([[[128, 128, 128], [76, 85, 255], [255, 128, 128]], [[0, 128, 128], [150, 44, 21], [29, 255, 107]]], dtype=U8)
    path = build(tmp_path / "ybr.dcm", ybr, bits_allocated=8, bits_stored=8, photometric="YBR_FULL")
    out = read_dicom(path)
    assert out.shape == (2, 3, 3) and out.dtype == U8
    # by hand (PS3.3 C.7.6.3.1.2): R = Y + 1.402 (Cr - 128); G = Y - 0.344136 (Cb - 128) - 0.714136 (Cr - 128); B = Y + 1.772 (Cb - 128)
    #   (128, 128, 128) -> grey 128;  (255, 128, 128) -> white;  (0, 128, 128) -> black
    #   (76, 85, 255): R = 76 + 178.05 = 254.05 -> 254; G = 76 + 14.80 - 90.70 = 0.10 -> 0; B = 76 - 76.20 -> 0
    assert out[0, 0].tolist() == [128, 128, 128]
    assert out[0, 1].tolist() == [254, 0, 0]
    assert out[0, 2].tolist() == [255, 255, 255]
    assert out[1, 0].tolist() == [0, 0, 0]
    # and every pixel as pydicom's own conversion gives it
    np.testing.assert_array_equal(out, convert_color_space(ybr.copy(), "YBR_FULL", "RGB"))


def test_ybr_full_422_is_upsampled_and_converted(tmp_path: Path) -> None:
    """YBR_FULL_422 (chroma shared by each pair) becomes full-size RGB."""
    # 2 x 2, each row one pair sharing Cb, Cr: Y1 Y2 Cb Cr
    raw = bytes([76, 128, 85, 255, 0, 255, 128, 128])
    path = build(tmp_path / "422.dcm", None, shape=(2, 2), pixel_bytes=raw, bits_allocated=8, bits_stored=8, photometric="YBR_FULL_422")
    # row 0: (76, 85, 255) -> (254, 0, 0); (128, 85, 255): R = 128 + 178.05 -> 255 (clipped), G = 128 + 14.80 - 90.70 = 52.10 -> 52,
    #        B = 128 - 76.20 = 51.80 -> 52
    # row 1: (0, 128, 128) -> black; (255, 128, 128) -> white
    expected = np.array([[[254, 0, 0], [255, 52, 52]], [[0, 0, 0], [255, 255, 255]]], dtype=U8)
    np.testing.assert_array_equal(read_dicom(path), expected)


def test_palette_color_through_its_lookup_tables(tmp_path: Path) -> None:
    """PALETTE COLOR indices go through the red, green and blue tables; 16-bit entries >> 8."""
    stored = np.array([[0, 1, 2], [3, 9, 2]])
    desc = [4, 0, 16]  # 4 entries from index 0, 16-bit entries
    red = np.array([0, 65535, 32768, 256], dtype="<u2").tobytes()
    green = np.array([65535, 0, 512, 1000], dtype="<u2").tobytes()
    blue = np.array([1280, 2560, 0, 65535], dtype="<u2").tobytes()
    path = build(tmp_path / "pal.dcm", stored, bits_allocated=8, bits_stored=8, photometric="PALETTE COLOR")
    ds = pydicom.dcmread(path)
    for colour, data in (("Red", red), ("Green", green), ("Blue", blue)):
        ds.add_new(Tag(f"{colour}PaletteColorLookupTableDescriptor"), "US", desc)
        ds.add_new(Tag(f"{colour}PaletteColorLookupTableData"), "OW", data)
    ds.save_as(path)
    # index 9 is past the table: the last entry. 16-bit entries >> 8:
    #   R: 0, 255, 128, 1   G: 255, 0, 2, 3   B: 5, 10, 0, 255
    expected = np.array(
        [[[0, 255, 5], [255, 0, 10], [128, 2, 0]], [[1, 3, 255], [1, 3, 255], [128, 2, 0]]],
        dtype=U8,
    )
    np.testing.assert_array_equal(read_dicom(path), expected)


# --- frames -----------------------------------------------------------------------------------


def test_multi_frame_needs_a_frame(tmp_path: Path) -> None:
    """A multi-frame file needs dicom-frame; frame=1 is the second frame; out-of-range frames are refused."""
    frames = np.array([[[1, 2, 3], [4, 5, 6]], [[10, 20, 30], [40, 50, 60]], [[7, 7, 7], [8, 8, 8]]])
    path = build(tmp_path / "mf.dcm", frames, frames=3, bits_allocated=8, bits_stored=8)
    with refused(r"multi-frame \(3 frames\); set the task's dicom-frame to choose one", path):
        read_dicom(path)
    # frame 1 is the second frame, 8-bit as is
    np.testing.assert_array_equal(read_dicom(path, frame=1), np.array([[10, 20, 30], [40, 50, 60]], dtype=U8))
    for bad in (3, -1):
        with refused(rf"dicom-frame {bad} is out of range; the file has 3 frame", path):
            read_dicom(path, frame=bad)


def test_single_frame_accepts_frame_zero_only(tmp_path: Path) -> None:
    """A single-frame file takes frame 0 and refuses frame 1."""
    path = build(tmp_path / "one.dcm", np.array([[9, 8], [7, 6]]), bits_allocated=8, bits_stored=8)
    np.testing.assert_array_equal(read_dicom(path, frame=0), np.array([[9, 8], [7, 6]], dtype=U8))
    with refused("out of range", path):
        read_dicom(path, frame=1)


# --- refusals ---------------------------------------------------------------------------------


def test_no_pixel_data(tmp_path: Path) -> None:
    """A dataset without Pixel Data is refused as 'no pixel data'."""
    path = build(tmp_path / "sr.dcm", np.zeros((2, 2)), bits_allocated=8, bits_stored=8)
    ds = pydicom.dcmread(path)
    del ds.PixelData
    ds.save_as(path)
    with refused(r"no pixel data \(", path):
        read_dicom(path)


def test_not_a_dicom_file(tmp_path: Path) -> None:
    """A non-DICOM file is refused, naming the file."""
    path = tmp_path / "photo.dcm"
    path.write_bytes(b"\x89PNG not dicom at all" * 10)
    with refused("not a readable DICOM file", path):
        read_dicom(path)


def test_32bit_pixels_are_refused(tmp_path: Path) -> None:
    """32 bits stored is refused, naming the depth and the 16-bit limit."""
    path = build(tmp_path / "b32.dcm", np.array([[1, 2], [3, 70000]]), bits_allocated=32, bits_stored=32)
    with refused(r"32-bit pixels \(Bits Stored 32\); the federation reads up to 16 bits", path):
        read_dicom(path)


def test_unsupported_photometric_interpretation(tmp_path: Path) -> None:
    """An unknown photometric interpretation is named with the supported ones."""
    path = build(tmp_path / "hsv.dcm", np.zeros((2, 2)), bits_allocated=8, bits_stored=8, photometric="HSV")
    with refused(r"photometric interpretation 'HSV'; supported: MONOCHROME1, MONOCHROME2, RGB, YBR_FULL", path):
        read_dicom(path)


def test_unknown_transfer_syntax(tmp_path: Path) -> None:
    """A transfer syntax pydicom has no decoder for at all is named."""
    # MPEG-2 video: a real transfer syntax with no pydicom pixel decoder
    path = build(tmp_path / "video.dcm", None, shape=(2, 2), pixel_bytes=encapsulate([b"\0\0\1\xb3"]), tsyntax=MPEG2MPML, bits_allocated=8, bits_stored=8)
    with refused(r"transfer syntax MPEG2 .*\(1\.2\.840\.10008\.1\.2\.4\.100\), which pydicom cannot decode", path):
        read_dicom(path)


# --- compressed transfer syntaxes -------------------------------------------------------------


def _rle_file(tmp_path: Path) -> Path:
    stored = np.array([[0, 1000, 2000], [3000, 4000, 4095]])
    native = build(tmp_path / "native.dcm", stored, bits_allocated=16, bits_stored=12)
    ds = pydicom.dcmread(native)
    ds.compress(RLELossless)  # pydicom's own RLE encoder
    path = tmp_path / "rle.dcm"
    ds.save_as(path)
    return path


def test_rle_lossless_decodes(tmp_path: Path) -> None:
    """RLE Lossless (pydicom's own encoder and decoder) decodes to the same pixels as native data."""
    path = _rle_file(tmp_path)
    assert pydicom.dcmread(path).file_meta.TransferSyntaxUID == RLELossless
    # min-max over [0, 4095]: x / 4095 * 255: 1000 -> 62.27 -> 62; 2000 -> 124.54 -> 125; 3000 -> 186.81 -> 187; 4000 -> 249.08 -> 249
    np.testing.assert_array_equal(read_dicom(path), np.array([[0, 62, 125], [187, 249, 255]], dtype=U8))


def test_missing_decoder_names_syntax_and_extra(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """With no plugin for the syntax the error names it (name and UID) and the hospitrust[dicom] extra."""
    path = _rle_file(tmp_path)
    decoder = get_decoder(RLELossless)
    # as on a machine without any RLE plugin: pydicom lists none as available
    monkeypatch.setattr(decoder, "_available", {})
    assert not decoder.is_available
    with refused("RLE Lossless", path) as err:
        read_dicom(path)
    message = err.value.detail
    assert "RLE Lossless" in message and "1.2.840.10008.1.2.5" in message
    assert "pip install 'hospitrust[dicom]'" in message and "pip install 'hospitrust[dicom]'" in str(err.value)


def test_missing_decoder_error_from_pixel_decoding(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The 'missing dependencies' error pydicom raises while decoding gives the same message."""
    path = _rle_file(tmp_path)
    decoder = get_decoder(RLELossless)

    def no_plugin(*args: object, **kwargs: object) -> None:
        # pydicom 3.0's words (pixels/common.py, _validate_plugins) when every plugin lacks its dependencies
        raise RuntimeError(
            "Unable to decompress 'RLE Lossless' pixel data because all plugins are missing dependencies:\n"
            "\tpylibjpeg - requires pylibjpeg>=2.0 and pylibjpeg-rle>=2.0"
        )

    monkeypatch.setattr(decoder, "as_array", no_plugin)
    with refused(r"RLE Lossless \(1\.2\.840\.10008\.1\.2\.5\).*hospitrust\[dicom\]", path):
        read_dicom(path)


def test_jpeg_baseline_decodes_through_a_plugin(tmp_path: Path) -> None:
    """JPEG baseline (encoded by Pillow, encapsulated by pydicom) decodes through an installed plugin."""
    # two flat 8 x 8 blocks: JPEG keeps flat blocks (DC only) to within a grey level or two
    grey = np.zeros((8, 16), dtype=U8)
    grey[:, :8], grey[:, 8:] = 60, 200
    buf = io.BytesIO()
    Image.fromarray(grey).save(buf, format="JPEG", quality=95)
    path = build(tmp_path / "jpg.dcm", grey, pixel_bytes=encapsulate([buf.getvalue()]), tsyntax=JPEGBaseline8Bit, bits_allocated=8, bits_stored=8)
    out = read_dicom(path)
    assert out.shape == (8, 16) and out.dtype == U8
    assert np.abs(out.astype(int) - grey.astype(int)).max() <= 2
