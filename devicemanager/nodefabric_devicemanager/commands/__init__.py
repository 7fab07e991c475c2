"""Subcommands that read this host."""
