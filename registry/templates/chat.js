// One turn: post the message (the write, with the session's CSRF token), then stream its
// events from the URL the registry answers with. The contextId of the last turn goes with the
// next; after a question, the next message is its answer (the waiting task's id goes with it).
(() => {
  const form = document.getElementById("say");
  const log = document.getElementById("chat-log");
  const where = document.getElementById("chat-context");
  let contextId = "", taskId = "";
  const add = (kind, text) => {
    const line = document.createElement("div");
    line.className = "msg " + kind;
    line.textContent = text;
    log.appendChild(line);
    line.scrollIntoView({block: "nearest"});
    return line;
  };
  const ready = (busy) => {
    form.querySelector("button").disabled = busy;
    form.text.placeholder = taskId ? "Your answer" : "Message";
    if (!busy) form.text.focus();
  };
  form.addEventListener("submit", async (event) => {
    event.preventDefault();
    const text = form.text.value.trim();
    if (!text) return;
    const body = new URLSearchParams(new FormData(form));
    body.set("text", text);
    body.set("context_id", contextId);
    body.set("task_id", taskId);
    add(taskId ? "you answer" : "you", text);
    form.text.value = "";
    taskId = "";
    ready(true);
    let posted, said;
    try {
      posted = await fetch("/console/chat", {method: "POST", body});
      said = await posted.json();
    } catch (e) {
      add("problem", "the registry did not answer: " + e);
      return ready(false);
    }
    if (!posted.ok) {
      add("problem", said.message || "refused: " + posted.status);
      return ready(false);
    }
    const stream = new EventSource(said.stream);
    let writing = null, ended = false;
    const on = (name, handle) =>
      stream.addEventListener(name, (m) => handle(JSON.parse(m.data)));
    on("progress", (d) => add("progress", d.line));
    on("text", (d) => {
      writing = writing || add("agent", "");
      writing.textContent += d.chunk;
    });
    on("answer", (d) => {
      const failed = d.state && d.state !== "completed";
      // The whole answer, where the streamed pieces were not all of it (a node whose last
      // chunk carries text): it replaces them rather than saying it twice.
      if (d.text && writing && !failed) writing.textContent = d.text;
      else if (d.text) add(failed ? "agent failed" : "agent", d.text);
      for (const line of d.attached || []) add("progress", "  " + line);
    });
    on("question", (d) => {
      for (const line of d.lines) add("question", line);
      taskId = d.task_id;
    });
    on("problem", (d) => add("problem", d.text));
    on("end", (d) => {
      ended = true;
      stream.close();
      contextId = d.context_id || contextId;
      where.dataset.context = contextId;
      where.textContent = contextId ? "context " + contextId : "";
      ready(false);
    });
    stream.onerror = () => {
      if (ended) return;
      stream.close();
      add("problem", "the stream broke off: the task may go on at the agent (see its page)");
      ready(false);
    };
  });
  form.text.addEventListener("keydown", (e) => {
    if (e.key === "Enter" && !e.shiftKey) { e.preventDefault(); form.requestSubmit(); }
  });
})();
