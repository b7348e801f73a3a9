"""Storage: the Persistent State Repository M on SQLite or PostgreSQL, its named migrations, session dumps."""
