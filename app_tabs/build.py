"""The Build tab: the Configure tab's merge built in memory (``/build``), and the built merge
saved (``/save``), zipped (``/download``) or pushed to the Hub (``/push``)."""
from __future__ import annotations

import filecmp
import os
import tempfile
from pathlib import Path

import gradio as gr

from layerswap_core.workbench import saves
from layerswap_core.workbench import session as wb
from layerswap_core.workbench import build as wb_build
from layerswap_core.workbench.served import LIMITS

from .common import LABELS, Tab, gr_progress, guarded, heavy_slots, light_slots, ok, warn
from .chat import ChatHandles
from .configure import ConfigureHandles
from .evaluate import EvaluateHandles
from .models import ModelsHandles


def web_server_copy(path: Path) -> Path | None:
    """The web server's copy of a file handed to the page: Gradio copies an output file into
    its cache folder (``GRADIO_TEMP_DIR``, else ``gradio`` in the system temporary folder), in
    a folder of its own named by a hash of the content, under the file's name. Found by name
    and content (a file equal to ours is the same copy)."""
    cache = Path(os.environ.get("GRADIO_TEMP_DIR")
                 or (Path(tempfile.gettempdir()) / "gradio").resolve())
    for copy in cache.glob(f"*/{path.name}"):
        if copy.is_file() and filecmp.cmp(copy, path, shallow=False):
            return copy
    return None


class BuildTab(Tab):
    VIEWS = {"build_md": "", "config_yaml": "", "zip_file": None}
    OUTPUTS = {
        "build": ("build_md", "config_yaml", "status", "eval_md", "chat_md", *LABELS),
        "save": ("build_md",),
        "push": ("build_md",),
        "download": ("build_md", "zip_file"),
    }

    @guarded("build_md")
    def build(self, v, progress=gr.Progress()):
        session = wb.require(v[self.page.session])
        config = self.configure.config(v, session)
        result = wb_build.build(session, config, gr_progress(progress))
        # the other tabs' "build first" lines go
        return {self.build_md: ok(result.markdown()), self.config_yaml: config.to_yaml(),
                **self.page.banner(session), self.evaluate.eval_md: "", self.chat.chat_md: "",
                **self.page.labels(session, config)}

    @guarded("build_md")
    def save(self, v, request: gr.Request, profile: gr.OAuthProfile | None,
             progress=gr.Progress()):
        session = wb.require(v[self.page.session])
        config = session.built()   # what the page shows built, whatever Configure shows now
        out = wb_build.save(session, config, v[self.folder], v[self.overwrite],
                            gr_progress(progress), access=self.page.visitor(request, profile))
        # served: by its name (the server's folders are not the visitor's business)
        where = f"as `{out.name}`" if self.page.access.served else f"to `{out}`"
        return {self.build_md: ok(f"Saved {where}: the built merge "
                                  f"({config.describe(session.num_layers)}).")}

    def download(self, v, request: gr.Request):
        """The zip from a temporary folder of the visitor's, removed once it was handed over
        (the web server keeps its own copy until the page closes)."""
        try:
            session = wb.require(v[self.page.session])
            namespace = self.page.visitor(request).namespace
            config = session.built()
            with saves.temp_folder(namespace) as tmp:
                path = wb_build.export_zip(session, config, tmp)
                yield {self.build_md: ok("Config and model card of the built merge ("
                                         f"{config.describe(session.num_layers)}) zipped."),
                       self.zip_file: str(path)}
                # handed over: the web server copied it into its cache; that copy goes when
                # the page closes, ours now
                copy = web_server_copy(path)
                if copy is not None:
                    saves.remember(namespace, copy)
        except Exception as e:  # noqa: BLE001 - everything reaches the page as one line
            yield {self.build_md: warn(e)}

    @guarded("build_md")
    def push(self, v, token: gr.OAuthToken | None, profile: gr.OAuthProfile | None,
             progress=gr.Progress()):
        session = wb.require(v[self.page.session])
        config = session.built()
        url = wb_build.push_to_hub(session, config, v[self.repo_id], v[self.private],
                                   gr_progress(progress),
                                   visitor_token=getattr(token, "token", None),
                                   visitor=getattr(profile, "username", None))
        return {self.build_md: ok(f"Pushed the built merge "
                                  f"({config.describe(session.num_layers)}) to {url}")}

    # ---- layout
    def layout(self) -> None:
        access = self.page.access
        if access.served:
            where = dict(label="Save as (a folder name, kept in this server's output folder)",
                         placeholder="my-merge", max_length=LIMITS.name_chars)
        else:
            where = dict(label=f"Save to folder (a name is saved in {access.output_root}; "
                               "or an absolute path)",
                         placeholder="my-merge", max_length=LIMITS.ref_chars)
        with gr.Tab("Build", id="build"):
            with gr.Row():
                self.build_btn = gr.Button("Build merged model (in memory)", variant="primary",
                                           elem_id="build-btn")
                self.cancel_btn = gr.Button("Cancel", variant="stop", elem_id="build-cancel")
            self.build_label = gr.Markdown(elem_id="build-acts-on")
            self.build_md = gr.Markdown(elem_id="build-status")
            self.config_yaml = gr.Code(label="layerswap.yaml", language="yaml")
            self.saves_label = gr.Markdown(elem_id="saves-acts-on")
            with gr.Row():
                self.folder = gr.Textbox(elem_id="folder", **where)
                self.overwrite = gr.Checkbox(
                    False, label="Overwrite (only a folder saved by layerswap)")
                self.save_btn = gr.Button("Save")
            with gr.Row():
                self.zip_btn = gr.Button("Zip config + model card")
                self.zip_file = gr.File(label="Download")
            # only with a token and the network (``PageBase.can_push``)
            if not self.page.can_push:
                gr.Markdown("Push to the Hub: set `HF_TOKEN` and run locally, or sign in on a "
                            "Space (visitors never push with the server's token).")
            with gr.Row(visible=self.page.can_push):
                self.repo_id = gr.Textbox(label="Push to the Hub as",
                                          placeholder="your-name/merged-model",
                                          max_length=LIMITS.ref_chars)
                self.private = gr.Checkbox(True, label="Private")
                self.push_btn = gr.Button("Push")
        self.page.label_lines.update(build_label=self.build_label, saves_label=self.saves_label)

    # ---- wiring
    def wire(self, demo: gr.Blocks, configure: ConfigureHandles, models: ModelsHandles,
             evaluate: EvaluateHandles, chat: ChatHandles):
        """``configure``: the merge configured (what Build builds); ``models``: the model
        lists (served: a save joins them); ``evaluate``, ``chat``: their status lines, which a
        build empties (their "build first")."""
        self.configure, self.evaluate, self.chat = configure, evaluate, chat
        self.given = (configure, evaluate, chat)
        page = self.page
        page.wire_run(self.build_btn, self.build_md, self.cancel_btn)
        self.build_btn.click(self.build, set(configure.inputs),
                             self.outputs("build"),
                             api_name="build", **light_slots())
        saved = self.save_btn.click(self.save, {page.session, self.folder, self.overwrite},
                                    self.outputs("save"), api_name="save", **heavy_slots())
        if page.access.served:   # the new save in the visitor's model lists
            saved.then(models.own_saves, None, [models.base, models.task, models.lang],
                       api_visibility="private")
        self.push_btn.click(self.push, {page.session, self.repo_id, self.private},
                            self.outputs("push"), api_name="push", **heavy_slots())
        self.zip_btn.click(self.download, {page.session}, self.outputs("download"),
                           api_name="download")
