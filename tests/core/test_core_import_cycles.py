"""No two modules of ours import each other in a loop, directly or through others, counting the imports
made only for type checking (a loop a reader must untangle is a loop, whoever runs it). import-linter's
contracts check direction between named layers; this checks every module against every other."""

from __future__ import annotations

import grimp

PACKAGES = ("nodefabric_devicemanager", "nodefabric_deviceplugin", "nodefabric_operator")


def import_loops(graph: grimp.ImportGraph) -> list[str]:
    """Every direct import whose target imports its importer back, with the way back."""
    loops = []
    for importer in sorted(graph.modules):
        for imported in sorted(graph.find_modules_directly_imported_by(importer)):
            back = graph.find_shortest_chain(importer=imported, imported=importer)
            if back is not None:
                loops.append(f"{importer} -> {' -> '.join(back)}")
    return loops


def test_no_module_imports_itself_through_others() -> None:
    graph = grimp.build_graph(*PACKAGES, exclude_type_checking_imports=False, cache_dir=None)
    assert len(graph.modules) > 100  # the packages were found, not an empty graph that holds no loop
    assert import_loops(graph) == []


def test_a_loop_is_found_and_shown_with_its_way_back() -> None:
    graph = grimp.ImportGraph()
    for module in ("pkg.a", "pkg.b", "pkg.c", "pkg.d"):
        graph.add_module(module)
    graph.add_import(importer="pkg.a", imported="pkg.b")
    graph.add_import(importer="pkg.b", imported="pkg.c")
    graph.add_import(importer="pkg.c", imported="pkg.a")
    graph.add_import(importer="pkg.a", imported="pkg.d")  # not in the loop: not reported
    assert import_loops(graph) == [
        "pkg.a -> pkg.b -> pkg.c -> pkg.a",
        "pkg.b -> pkg.c -> pkg.a -> pkg.b",
        "pkg.c -> pkg.a -> pkg.b -> pkg.c",
    ]
