"""The quickstart's machinery: its stages (stages.py: the presets, each stage of the lifecycle, their timings) and its
report (report.py: Table 2's claims, the figures, report.md); `openrealm quickstart` is trainers/jobs/quickstart.py."""

__all__: list[str] = []
