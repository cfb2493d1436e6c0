"""The launcher's pieces: folders, model download, and (beside them) hardware, presets, supervisor, tray."""
