"""The `ocr` task: PP-OCR text detection, direction classification and recognition as one pipeline."""
