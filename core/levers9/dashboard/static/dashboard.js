// levers9 dashboard: the little the pages need a script for, written for levers9 (no library).
//
// * [data-live=URL]: a region the server re-renders; its server-sent events ("region") replace the region's
//   HTML, so a page updates without a reload. "end" closes the stream; "signed-out" (the session ended)
//   reloads the page, which leads to signing in. The browser's own reconnection covers a dropped connection.
// * pre[data-logs=URL]: a task's output; each "log" event is appended as text. "end": the task finished.
// * form[data-upload]: a file sent with PUT to the form's action and the file's name, with the page's CSRF token
//   in a header (no multipart parsing on the server).
// Everything the server sends is HTML it escaped itself, or text inserted as text.
"use strict";

function liveRegions() {
  document.querySelectorAll("[data-live]").forEach(function (region) {
    var source = new EventSource(region.getAttribute("data-live"));
    source.addEventListener("region", function (event) {
      var focused = focusKey(region);
      region.innerHTML = event.data;
      region.setAttribute("data-updated", String(Date.now()));
      if (focused) { refocus(region, focused); }
    });
    source.addEventListener("end", function () {
      source.close();
    });
    source.addEventListener("signed-out", signedOut(source));
    window.addEventListener("pagehide", function () { source.close(); });
  });
}

// What names the focused control inside a region, so the same control has the focus after the region is
// replaced (a keyboard user's place is kept): its id, else its accessible label, else its text.
function focusKey(region) {
  var active = document.activeElement;
  if (!active || active === document.body || !region.contains(active)) { return null; }
  return {
    id: active.id || "",
    label: active.getAttribute("aria-label") || "",
    text: (active.textContent || "").trim(),
    tag: active.tagName
  };
}

function refocus(region, key) {
  var candidates = region.querySelectorAll("a, button, input, select, textarea, [tabindex]");
  for (var i = 0; i < candidates.length; i++) {
    var element = candidates[i];
    var same = key.id ? element.id === key.id
      : key.label ? element.getAttribute("aria-label") === key.label
      : element.tagName === key.tag && (element.textContent || "").trim() === key.text;
    if (same) { element.focus(); return; }
  }
}

// The page is being left (a form submitted, a link followed): a stream's "signed-out" must not reload it then. The
// sign-out form's own answer clears the cookie; a reload racing it would cancel that answer and keep the cookie.
var leaving = false;
document.addEventListener("submit", function (event) {
  if (!event.defaultPrevented) { leaving = true; }
});
window.addEventListener("beforeunload", function () { leaving = true; });

// The session ended (signed out, revoked, expired): reloading leads to the sign-in page, and back here after.
function signedOut(source) {
  return function () {
    source.close();
    if (!leaving) { window.location.reload(); }
  };
}

function liveLogs() {
  document.querySelectorAll("pre[data-logs]").forEach(function (pre) {
    var state = document.getElementById(pre.getAttribute("aria-describedby") || "");
    var source = new EventSource(pre.getAttribute("data-logs"));
    var follow = true;
    pre.addEventListener("scroll", function () {
      follow = pre.scrollTop + pre.clientHeight >= pre.scrollHeight - 4;
    });
    source.addEventListener("log", function (event) {
      pre.appendChild(document.createTextNode(event.data));
      if (follow) { pre.scrollTop = pre.scrollHeight; }
    });
    source.addEventListener("end", function (event) {
      source.close();
      if (state) { state.textContent = event.data || "The output ended."; }
    });
    source.addEventListener("signed-out", signedOut(source));
    source.onerror = function () {
      if (source.readyState === EventSource.CLOSED && state) { state.textContent = "The output stream closed."; }
    };
    window.addEventListener("pagehide", function () { source.close(); });
  });
}

function uploads() {
  document.querySelectorAll("form[data-upload]").forEach(function (form) {
    form.addEventListener("submit", function (event) {
      event.preventDefault();
      var input = form.querySelector("input[type=file]");
      var csrf = form.querySelector("input[name=csrf]");
      var state = form.querySelector("[data-upload-state]");
      if (!input || !input.files || input.files.length === 0) {
        if (state) { state.textContent = "Choose a file first."; }
        return;
      }
      var file = input.files[0];
      var url = form.getAttribute("action") + "/" + encodeURIComponent(file.name);
      if (state) { state.textContent = "Uploading " + file.name + "…"; }
      fetch(url, {
        method: "PUT",
        body: file,
        credentials: "same-origin",
        headers: { "X-CSRF-Token": csrf ? csrf.value : "", "Content-Type": "application/octet-stream" }
      }).then(function (response) {
        return response.text().then(function (text) {
          if (response.ok) { window.location.reload(); return; }
          if (state) { state.textContent = "Upload refused (" + response.status + "): " + text; }
        });
      }).catch(function (error) {
        if (state) { state.textContent = "Upload failed: " + error; }
      });
    });
  });
}

document.addEventListener("DOMContentLoaded", function () {
  liveRegions();
  liveLogs();
  uploads();
});
