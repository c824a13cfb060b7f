"""What a run leaves in --output_dir: its layout, checkpoints, exports, atomic files, and the handling of a full or read-only disk."""
