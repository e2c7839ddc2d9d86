"""`python -m bench.ocr`: see bench/ocr/run.py."""

from bench.ocr.run import main

raise SystemExit(main())
