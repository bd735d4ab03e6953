"""The dashboard's pages, one module each, each exposing ``render(ctx)``."""
