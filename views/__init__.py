"""Chart builders and the HTML report: Altair and pandas only -- no Streamlit, no torch.

Used by the pages (through ``ui/``), the CLI (``python -m engine report``) and the report, so a chart
looks the same in the dashboard, in the offline HTML file and in the exported SVG/PNG images.
"""
