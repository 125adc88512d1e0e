"""Small Sphinx fixes for the attnbook website.

Jupyter Book and sphinx-book-theme both set up sphinx-thebe, which then adds its inline configuration
script twice; the second copy throws "Identifier 'THEBE_JS_URL' has already been declared" in every
browser console. This extension drops exact duplicate script entries from each page, and gives the theme
a default colour mode (unset, pydata-sphinx-theme logs a console error on a reader's first visit).

The ipywidgets HTML manager (served from the site's own vendor/widgets/, see the Makefile) finds its icon
fonts relative to the URL under which require.js registered its modules; left alone, that is a path under the
page that does not exist (404s, console errors). A require.js configuration, defined before require.js loads,
maps those modules to vendor/widgets/, and the manager's own asset path is set to the same place.

Exercises (sphinx-exercise) are numbered per chapter, "Exercise 2.3" for the third exercise of
``book/02_*``, instead of sphinx's book-wide count (1, 2, ... 30 across the book), so that the number on
the page is the id its checker is registered under (``attnbook.exercises.check("2.3", ...)``). Inside a
solution, a ``<details>`` wrapper (which folds a written derivation in Colab, where markdown cannot be
folded otherwise) is dropped: on the website the solution's own dropdown already folds it.

``static/attnbook.css`` wraps long lines in blocks marked ``:class: wrap`` (the package's 120-column source
shown in a "How the package does it fast" fold) instead of letting them scroll sideways.
"""

import pathlib
import re

from docutils import nodes

STATIC = pathlib.Path(__file__).parent / "static"

WIDGET_ASSETS = (
    "(function () {"
    "var root = new URL((document.documentElement.dataset.content_root || '') + 'vendor/widgets/',"
    " document.baseURI).href;"
    "window.__jupyter_widgets_assets_path__ = root;"
    "window.require = {paths: {'@jupyter-widgets/html-manager/dist': root.replace(/\\/$/, '')}};"
    "})();"
)


def _script_key(script):
    attributes = getattr(script, "attributes", {}) or {}
    # an inline script may carry filename None or "" depending on who added it
    return getattr(script, "filename", None) or "", tuple(sorted((k, str(v)) for k, v in attributes.items()))


def drop_duplicate_scripts(app, pagename, templatename, context, doctree):
    scripts = context.get("script_files")
    if not scripts:
        return
    seen, unique = set(), []
    for script in scripts:
        key = _script_key(script)
        if key not in seen:
            seen.add(key)
            unique.append(script)
    scripts[:] = unique  # in place: handlers that run later add their scripts to this same list


def default_colour_mode(app, pagename, templatename, context, doctree):
    if not context.get("default_mode"):
        context["default_mode"] = "light"


_CHAPTER = re.compile(r"(?:^|/)(\d+)_[^/]*$")


def number_exercises_per_chapter(app, env):
    """Exercise k of chapter N gets the number (N, k), in the order sphinx numbered them.

    Runs on env-get-updated after sphinx's own toctree collector has assigned the book-wide numbers.
    """
    for docname, numbers in env.toc_fignumbers.items():
        match = _CHAPTER.search(docname)
        exercises = numbers.get("exercise")
        if not match or not exercises:
            continue
        chapter = int(match.group(1))
        in_order = sorted(exercises, key=lambda ident: exercises[ident])
        numbers["exercise"] = {ident: (chapter, k) for k, ident in enumerate(in_order, start=1)}
    return []  # no document needs rewriting because of this


_DETAILS = re.compile(r"^\s*(<details>|</details>|<summary>.*?</summary>|<details>\s*<summary>.*?</summary>)\s*$", re.S)


def drop_details_in_solutions(app, doctree, docname):
    """Remove raw ``<details>`` / ``<summary>`` / ``</details>`` markup inside solutions (Colab's fold)."""
    for raw in list(doctree.findall(nodes.raw)):
        if raw.get("format") != "html" or not _DETAILS.match(raw.astext()):
            continue
        parent = raw.parent
        while parent is not None and "solution" not in parent.get("classes", []):
            parent = parent.parent
        if parent is not None:
            raw.parent.remove(raw)


def add_static(app):
    app.config.html_static_path.append(str(STATIC))


def setup(app):
    app.connect("builder-inited", add_static)
    app.add_css_file("attnbook.css")
    app.add_js_file(None, body=WIDGET_ASSETS, priority=400)  # before the widget manager (priority 500)
    # html-page-context stops at the first handler that returns a template name, so run early; the
    # duplicates are already in the list by then (sphinx-thebe adds them before reading the documents).
    app.connect("html-page-context", drop_duplicate_scripts, priority=100)
    app.connect("html-page-context", default_colour_mode, priority=100)
    app.connect("env-get-updated", number_exercises_per_chapter, priority=900)
    app.connect("doctree-resolved", drop_details_in_solutions)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
