"""The OCR benchmark (run.py) and the rendered images it and the ocr task's tests read (samples.py)."""
