"""Notebook 12: ``python -m course_utils.doctor``, the doctor beside a stuck or slow job (:mod:`.examination`)."""

import sys

from course_utils.doctor.examination import main

sys.exit(main())
