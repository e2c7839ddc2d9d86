"""Rendered test images for OCR: text lines in Debian's DejaVu (Latin) and WenQuanYi Zen Hei (Chinese) fonts."""

from __future__ import annotations

import io
from dataclasses import dataclass
from pathlib import Path

import numpy as np
from PIL import Image, ImageDraw, ImageFont

LATIN_FONT = Path("/usr/share/fonts/truetype/dejavu/DejaVuSans.ttf")  # Debian fonts-dejavu-core
CHINESE_FONT = Path("/usr/share/fonts/truetype/wqy/wqy-zenhei.ttc")  # Debian fonts-wqy-zenhei
FONT_PACKAGES = {LATIN_FONT: "fonts-dejavu-core", CHINESE_FONT: "fonts-wqy-zenhei"}

ENGLISH = (
    "The quick brown fox jumps over",
    "Skiff serves PaddleOCR models",
    "Invoice 2024-0815 total 1234.50",
)
CHINESE = (
    "深度学习推理服务",
    "北京市海淀区中关村大街",
    "今天天气很好",
)
# The seed scenario: the front of a Chinese resident ID card (name, sex, ethnicity, birth date, address, number).
ID_CARD = (
    "姓名 张伟",
    "性别 男  民族 汉",
    "出生 1990年3月7日",
    "住址 北京市海淀区中关村大街27号",
    "公民身份号码 110108199003071234",
)


@dataclass(frozen=True)
class Sample:
    """An image and the text lines drawn on it, top to bottom."""

    name: str
    lines: tuple[str, ...]
    png: bytes

    def rgb(self) -> np.ndarray:
        return np.asarray(Image.open(io.BytesIO(self.png)).convert("RGB"))


def missing_fonts() -> list[str]:
    """Debian packages whose fonts are not installed (.ci/run's apt line installs them)."""
    return sorted(package for path, package in FONT_PACKAGES.items() if not path.is_file())


def render(name: str, lines: tuple[str, ...], font: Path, size: int = 32, width: int = 760) -> Sample:
    """Black text on white, one line every 2 font sizes."""
    face = ImageFont.truetype(str(font), size)
    image = Image.new("RGB", (width, 40 + 2 * size * len(lines)), "white")
    draw = ImageDraw.Draw(image)
    for row, line in enumerate(lines):
        draw.text((24, 20 + 2 * size * row), line, fill="black", font=face)
    out = io.BytesIO()
    image.save(out, "PNG")
    return Sample(name, lines, out.getvalue())


def id_card() -> Sample:
    """An ID-card-like image: a pale card, labels and values in the Chinese font, as JPEG (what cameras send)."""
    face = ImageFont.truetype(str(CHINESE_FONT), 30)
    image = Image.new("RGB", (856, 540), (236, 240, 232))
    draw = ImageDraw.Draw(image)
    draw.rectangle((600, 60, 820, 330), outline=(170, 170, 170), width=3)  # the photo's frame
    for row, line in enumerate(ID_CARD):
        y = 440 if row == len(ID_CARD) - 1 else 50 + 80 * row
        draw.text((40, y), line, fill=(20, 20, 20), font=face)
    out = io.BytesIO()
    image.save(out, "JPEG", quality=92)
    return Sample("id-card", ID_CARD, out.getvalue())


def samples() -> list[Sample]:
    """Every rendered sample: English, Chinese, and the ID card."""
    return [render("english", ENGLISH, LATIN_FONT), render("chinese", CHINESE, CHINESE_FONT), id_card()]
