"""Workbench: what the app shows, as plain functions over a per-visitor session (model choice,
served-mode checks, build, evaluate, sweep, chat, save), its figures and the ZeroGPU shim. The
Gradio page in app.py only lays these out."""
