"""The one error of fine-tuning: a bad request (unknown head, unsupported architecture, empty data ...),
shown to the user as is (CLI: one line and exit 2; Improve page: ``st.error``)."""


class FinetuneError(ValueError):
    """A bad fine-tuning request (unknown head, unsupported architecture, empty data ...)."""
