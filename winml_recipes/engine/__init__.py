"""The engine: pass registry, planning, running with a content-addressed cache, manifest."""
