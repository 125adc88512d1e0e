"""Small Sphinx fixes for the attnbook website.

Jupyter Book and sphinx-book-theme both set up sphinx-thebe, which then adds its inline configuration
script twice; the second copy throws "Identifier 'THEBE_JS_URL' has already been declared" in every
browser console. This extension drops exact duplicate script entries from each page, and gives the theme
a default colour mode (unset, pydata-sphinx-theme logs a console error on a reader's first visit).
"""


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
    # html-page-context stops at the first handler that returns a template name, so run early; the
    # duplicates are already in the list by then (sphinx-thebe adds them before reading the documents).
    app.connect("html-page-context", drop_duplicate_scripts, priority=100)
    app.connect("html-page-context", default_colour_mode, priority=100)
    return {"parallel_read_safe": True, "parallel_write_safe": True}
