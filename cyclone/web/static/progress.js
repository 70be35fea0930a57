/* The run page's progress and stream, from the run's server-sent events
 * (/runs/{id}/stream): a bar per node whose progress is a fraction (a number from 0 to 1,
 * or {"done": n, "total": m}), its value as text otherwise; and the stream's last items.
 * Values are shown as text only. The stream closes once the run has ended. */
(function () {
  "use strict";
  var section = document.getElementById("progress");
  if (!section || !window.EventSource) return;
  var bars = document.getElementById("progress-bars");
  var list = document.getElementById("stream-items");
  var status = document.getElementById("stream-status");
  var KEEP = 20;

  function fraction(v) {
    if (typeof v === "number") return v >= 0 && v <= 1 ? v : null;
    if (v && typeof v === "object" && typeof v.done === "number" &&
        typeof v.total === "number" && v.total > 0) {
      return Math.min(Math.max(v.done / v.total, 0), 1);
    }
    return null;
  }

  function show(progress) {
    var nodes = Object.keys(progress).sort();
    bars.textContent = "";
    if (!nodes.length) {
      var none = document.createElement("p");
      none.className = "muted";
      none.textContent = "No progress reported.";
      bars.appendChild(none);
      return;
    }
    nodes.forEach(function (node) {
      var value = progress[node], f = fraction(value);
      var row = document.createElement("div");
      row.className = "bar";
      row.dataset.node = node;
      var label = document.createElement("span");
      label.className = "node";
      label.textContent = node;
      row.appendChild(label);
      if (f !== null) {
        var bar = document.createElement("progress");
        bar.max = 1;
        bar.value = f;
        row.appendChild(bar);
      }
      var text = document.createElement("span");
      text.className = "value";
      text.textContent = f !== null ? Math.round(f * 100) + "%" : JSON.stringify(value);
      row.appendChild(text);
      bars.appendChild(row);
    });
  }

  var source = new EventSource(section.dataset.stream);
  source.addEventListener("progress", function (event) { show(JSON.parse(event.data)); });
  source.addEventListener("item", function (event) {
    var item = JSON.parse(event.data);
    var li = document.createElement("li");
    li.dataset.offset = item.offset;
    li.dataset.node = item.node;
    li.textContent = "#" + item.offset + " " + item.node + " (attempt " + item.attempt +
      "): " + JSON.stringify(item.value);
    list.appendChild(li);
    while (list.children.length > KEEP) list.removeChild(list.firstChild);
  });
  source.addEventListener("end", function () {
    source.close();
    status.textContent = "run ended";
  });
  source.onopen = function () { status.textContent = "live"; };
  source.onerror = function () {
    if (source.readyState !== EventSource.CLOSED) status.textContent = "reconnecting";
  };
})();
