"""The Tune callback that stops the trials behind (`stopping.behind`)."""
