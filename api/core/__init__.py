"""The service's foundation: settings, database engine and migrations, the local Ray's processes.

Imports no other api package.
"""
