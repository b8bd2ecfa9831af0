"""The Chat tab: the merged model and one other model answer side by side (``/chat``)."""
from __future__ import annotations

import time
from dataclasses import dataclass

import gradio as gr

from layerswap_core.workbench import session as wb
from layerswap_core.evaluation.languages import LANGUAGES
from layerswap_core.workbench.chat import (chat_examples, chat_turn, check_chat_message,
                                           example_languages, examples_code, plain_history)
from layerswap_core.workbench.demo import trio_in_use
from layerswap_core.workbench.served import LIMITS, limits_for, Cancelled

from .common import Tab, chat_slots, ok, warn


def run_chats(session, message, merged_history, other_history, other, settings, deadline):
    """The merged model's answer, then the other model's: (role, ChatReply) as they grow."""
    for role, history in (("merged", merged_history), (other, other_history)):
        for reply in chat_turn(session, message, history, role, *settings, deadline=deadline):
            yield role, reply


@dataclass(frozen=True)
class ChatHandles:
    """What the Chat tab gives the others: its status line (a build empties it) and what the
    demo trio in use says to expect."""
    chat_md: gr.Markdown
    chat_expectations: gr.Markdown


class ChatTab(Tab):
    VIEWS = {"chat_md": "", "chat_merged": lambda: [], "chat_other": lambda: []}
    OUTPUTS = {"chat": ("chat_md", "message", "chat_merged", "chat_other")}

    def chat(self, v):
        """Stream the merged model's answer, then the other model's, side by side, within the
        server's time per request."""
        deadline = time.monotonic() + LIMITS.request_seconds
        shown, notes = {}, {}
        try:
            session = wb.require(v[self.page.session])
            text = check_chat_message(v[self.message], v[self.chat_merged])
            plain_history(v[self.chat_other])  # both panes checked before anything runs
            label = v[self.other_role]
            other = next(r for r, name in wb.ROLE_LABELS.items() if name == label)
            panes = {"merged": self.chat_merged, other: self.chat_other}
            settings = (v[self.chat_tokens], v[self.chat_temperature], v[self.chat_penalty])
            for role, reply in run_chats(session, text, v[self.chat_merged], v[self.chat_other],
                                         other, settings, deadline):
                shown[panes[role]] = reply.history
                notes[wb.ROLE_LABELS[role]] = reply.note()
                who = "Merged model" if role == "merged" else label
                yield {self.chat_md: f"⏳ {who} answering...", self.message: "", **shown}
            said = "; ".join(f"{who}: {n}" for who, n in notes.items() if n)
            yield {self.chat_md: ok("Done." + (f" ({said})" if said else "")), **shown}
        except Cancelled:   # Stop: the answers so far stay in the panes
            yield {self.chat_md: "■ Stopped: the answers so far are kept.", **shown}
        except Exception as e:  # noqa: BLE001
            yield {self.chat_md: warn(e), **shown}

    # ---- layout
    def example_views(self) -> list:
        return [self.message, *self.examples.values()]

    def show_examples(self, v) -> dict:
        """The example set of the session's language expert visible, the others hidden; the
        message box asks in that language (nothing changes without a session)."""
        session = v[self.page.session]
        if session is None:
            return gr.skip()
        code = examples_code(session.names.get("lang") or session.refs["lang"])
        return {**{column: gr.update(visible=c == code) for c, column in self.examples.items()},
                self.message: gr.update(placeholder=f"Ask a math question in "
                                                    f"{LANGUAGES[code].name}...")}

    def layout(self) -> ChatHandles:
        refs = self.page.refs
        language, _ = chat_examples(refs["lang"])
        with gr.Tab("Chat", id="chat"):
            # the demo trio in use's words (``demos.trios``; ``DemoSection.show_trio`` follows
            # the models picked)
            self.chat_expectations = gr.Markdown(trio_in_use(refs).chat_expectations,
                                                 elem_id="chat-expectations")
            self.chat_label = gr.Markdown(elem_id="chat-acts-on")
            # made before the panes (the API's parameter order), shown below them
            self.message = gr.Textbox(placeholder=f"Ask a math question in {language}...",
                                      show_label=False, scale=5, elem_id="chat-input",
                                      max_length=LIMITS.chat_chars, render=False)
            with gr.Row():
                self.chat_merged = gr.Chatbot(label="merged", height=360, elem_id="chat-merged")
                self.chat_other = gr.Chatbot(label="task expert", height=360, elem_id="chat-other")
            with gr.Row():
                self.message.render()
                self.send = gr.Button("Send", variant="primary", scale=1, elem_id="chat-send")
                self.chat_stop = gr.Button("Stop", variant="stop", scale=1, elem_id="chat-stop")
                self.clear = gr.Button("Clear", scale=1)
            self.chat_md = gr.Markdown(elem_id="chat-status")
            # one example set per language that has them; the one of the language expert in
            # use shows (``show_examples`` switches them with the models)
            shown = examples_code(refs["lang"])
            self.examples = {}   # language code -> its column of examples
            for code in example_languages():
                name = LANGUAGES[code].name
                with gr.Column(visible=code == shown, elem_id=f"chat-examples-{code}") as col:
                    gr.Examples([[e] for e in LANGUAGES[code].chat_examples], inputs=[self.message],
                                label=f"Examples in {name} (problems like the evaluated ones)")
                    if LANGUAGES[code].english_twins:
                        gr.Examples([[e] for e in LANGUAGES[code].english_twins],
                                    inputs=[self.message],
                                    label="The same problems in English (the control: the math "
                                          "expert learned these in English)")
                self.examples[code] = col
            with gr.Row():
                self.other_role = gr.Dropdown(["task expert", "language expert", "base"],
                                              value="task expert", label="Compare with")
                self.chat_tokens = gr.Slider(16, limits_for(self.page.access).new_tokens,
                                             value=96, step=16,
                                             label="Max new tokens", elem_id="chat-tokens")
                self.chat_temperature = gr.Slider(0.0, 1.5, value=0.0, step=0.05,
                                                  label="Temperature (0 = greedy)")
                self.chat_penalty = gr.Slider(1.0, 2.0, value=1.0, step=0.05,
                                              label="Repetition penalty")
        self.page.label_lines["chat_label"] = self.chat_label
        return ChatHandles(self.chat_md, self.chat_expectations)

    # ---- wiring
    def wire(self, demo: gr.Blocks, picked: list):
        """After each event in ``picked`` (new models), the examples of the language expert in
        use (``show_examples``)."""
        self.page.wire_run(self.send, self.chat_md, self.chat_stop)   # Stop: the answers stay
        for event in picked:
            event.then(self.show_examples, {self.page.session}, self.example_views(),
                       api_visibility="private", queue=False, show_progress="hidden")
        chat_inputs = {self.page.session, self.message, self.chat_merged, self.chat_other,
                       self.other_role, self.chat_tokens, self.chat_temperature, self.chat_penalty}
        self.send.click(self.chat, chat_inputs, self.outputs("chat"), api_name="chat",
                        **chat_slots())
        self.message.submit(self.chat, chat_inputs, self.outputs("chat"),
                            api_visibility="private", **chat_slots())
        self.clear.click(lambda: ([], [], ""), None, [self.chat_merged, self.chat_other,
                                                      self.chat_md], api_visibility="private")
        self.other_role.change(lambda r: gr.update(label=r, value=[]), self.other_role,
                               self.chat_other, api_visibility="private")
