"""Frozen attrs classes on the wire: one codec for stream rows and internal-call bodies.

A wire type declares each field once, with a :class:`~.kinds.FieldKind` in its
metadata (:func:`~.kinds.wire`) saying how its JSON value is read and checked (and
under which key it travels, when not its name). The same declarations give

* stream rows (``rows.py``): the JSON list of the fields in order, optionally
  tagged by row type, refused with :class:`~.rows.InvalidRow`;
* internal-call request and response bodies (``objects.py``): a JSON object
  of the fields by key, refused with a 400 naming the field.

Values are checked where they enter (a line or a request body is decoded);
building an instance in process checks nothing.
"""
