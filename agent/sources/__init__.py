"""Notice sources: each watches one origin and emits normalised `Notice`s."""
