"""Small Sphinx fixes for the attnbook website.

Jupyter Book and sphinx-book-theme both set up sphinx-thebe, which then adds its inline configuration
script twice; the second copy throws "Identifier 'THEBE_JS_URL' has already been declared" in every
browser console. This extension drops exact duplicate script entries from each page, and gives the theme
a default colour mode (unset, pydata-sphinx-theme logs a console error on a reader's first visit).

The ipywidgets HTML manager (served from the site's own vendor/widgets/, see the Makefile) finds its icon
fonts relative to the URL under which require.js registered its modules; left alone, that is a path under the
page that does not exist (404s, console errors). A require.js configuration, defined before require.js loads,
maps those modules to vendor/widgets/, and the manager's own asset path is set to the same place.
"""

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


def setup(app):
    app.add_js_file(None, body=WIDGET_ASSETS, priority=400)  # before the widget manager (priority 500)
    # html-page-context stops at the first handler that returns a template name, so run early; the
    # duplicates are already in the list by then (sphinx-thebe adds them before reading the documents).
    app.connect("html-page-context", drop_duplicate_scripts, priority=100)
    app.connect("html-page-context", default_colour_mode, priority=100)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
