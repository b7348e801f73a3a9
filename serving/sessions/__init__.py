"""Sessions and memory, the endpoint family of ``/v1/sessions`` and ``/v1/memory``: a key's sessions listed, one
session read (its memory, what runs in it now and, asked, its graph's layout), a finished request's record, the graph
page, export, import, delete, and memory search. ``routes.py`` the routes (typed query parameters in, response models
out: ``/openapi.json`` documents both), ``wire.py`` those models, ``service.py`` ``SessionsService`` over them; each
route reads and writes only the caller's namespace. A parameter a route does not take is a 400 ``unknown_parameter``;
one of the wrong type a 422, as on every typed route."""
