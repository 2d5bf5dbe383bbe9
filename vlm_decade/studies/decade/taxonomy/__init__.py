"""Study A's error taxonomy (METHOD.md): relevant objects, detector- and probe-based error labels,
hand labels with their agreement, spatial dependence from masked descriptions, and error impact."""
