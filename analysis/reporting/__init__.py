"""What users read: ``bcrit.json``, ``report.md`` / ``report.html``, the plots, and the analysis's MLflow records."""
