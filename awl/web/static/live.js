// Reloads the page when the desk changes (server-sent events from /events).
// The page works without this script; it only saves pressing reload.
(function () {
  "use strict";
  var body = document.body;
  if (!body || !body.hasAttribute("data-watch") || !window.EventSource) { return; }
  var watch = body.getAttribute("data-watch");
  // The desk's state this page was made from: a change before the stream opens still counts.
  var since = body.getAttribute("data-since") || "";
  var touched = false;
  document.addEventListener("input", function () { touched = true; });
  var source = new EventSource("/events?order=" + encodeURIComponent(watch) +
                               "&since=" + encodeURIComponent(since));
  source.addEventListener("change", function () {
    if (touched) {
      // Someone is filling in a form: say so instead of throwing their input away.
      document.getElementById("live").hidden = false;
    } else {
      source.close();
      window.location.reload();
    }
  });
  window.addEventListener("beforeunload", function () { source.close(); });
}());
