/* Cyclone dashboard: refresh the page's live part when the server says something changed
 * (server-sent events from LISTEN/NOTIFY), and on a timer as the fallback (shorter while
 * the event stream is down). No refresh while runs are selected for a bulk action, nor
 * while a field of the live part (a signal's payload) is being filled in. A sleeping node's
 * countdown ticks every second. */
(function () {
  "use strict";
  var body = document.body;
  var status = document.getElementById("live-status");
  var timer = null;

  function editing() {
    var active = document.activeElement;
    if (active && active.closest && active.closest("#live form") &&
        /^(TEXTAREA|SELECT|INPUT)$/.test(active.tagName) && active.name !== "id") return true;
    var fields = document.querySelectorAll("#live textarea");
    for (var i = 0; i < fields.length; i++) {
      if (fields[i].value !== fields[i].defaultValue) return true;
    }
    return false;
  }

  function refresh() {
    if (document.querySelector("input[name=id]:checked") || editing()) return;
    htmx.trigger(body, "cyclone-refresh");
  }

  function every(ms, label, cls) {
    if (timer) clearInterval(timer);
    timer = setInterval(refresh, ms);
    if (status) { status.textContent = label; status.className = "live " + cls; }
  }

  document.addEventListener("change", function (event) {
    if (event.target && event.target.id === "select-all") {
      document.querySelectorAll("input[name=id]").forEach(function (box) {
        box.checked = event.target.checked;
      });
    }
  });

  // A sleeping node's countdown: the seconds left when the server rendered it (so the
  // browser's clock does not matter), counted down here; at zero the page refreshes.
  function span(s) {
    var h = Math.floor(s / 3600), m = Math.floor((s % 3600) / 60), parts = [];
    if (h) parts.push(h + " h");
    if (h || m) parts.push(m + " min");
    parts.push((s % 60) + " s");
    return parts.join(" ");
  }

  function tick() {
    document.querySelectorAll(".countdown[data-left]").forEach(function (el) {
      if (!el.dataset.seen) el.dataset.seen = String(Date.now());
      var gone = (Date.now() - Number(el.dataset.seen)) / 1000;
      var left = Math.max(0, Math.round(Number(el.dataset.left) - gone));
      el.textContent = left > 0 ? "wakes in " + span(left) : "waking";
      if (left === 0 && !el.dataset.fired) { el.dataset.fired = "1"; setTimeout(refresh, 1000); }
    });
  }
  tick();
  setInterval(tick, 1000);

  if (!window.EventSource) { every(3000, "polling", "off"); return; }
  every(3000, "connecting", "off");
  var source = new EventSource(body.dataset.events);
  source.addEventListener("change", refresh);
  source.onopen = function () { every(10000, "live", "on"); };
  source.onerror = function () { every(3000, "polling", "off"); };
})();
