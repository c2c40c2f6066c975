"""One module per studio page: ``build(...)`` lays it out, handlers are plain functions."""
