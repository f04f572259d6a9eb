"""Data-quality and duplicate audits: Great Expectations suites derived from each pipeline's
declaration, reconciliation counts, the audit Delta table and the Data Docs reports."""
