// kb's pages (design §17) work without this script. It adds one thing: a page whose heading has
// data-live="<event stream URL>" reloads when the server says its workspace changed (server-sent
// events relaying kb_events), unless the reader is typing in a field.
(function () {
  "use strict";
  var live = document.querySelector("[data-live]");
  if (!live || !window.EventSource) { return; }
  var note = document.querySelector(".live-note");
  if (note) { note.hidden = false; }
  var pending = null;
  var source = new EventSource(live.getAttribute("data-live"));
  source.addEventListener("change", function () {
    if (pending) { return; }
    pending = window.setTimeout(function reload() {
      var active = document.activeElement;
      if (active && (active.tagName === "INPUT" || active.tagName === "TEXTAREA") && active.value) {
        pending = window.setTimeout(reload, 2000);
        return;
      }
      window.location.reload();
    }, 500);
  });
})();
