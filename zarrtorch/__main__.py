from zarrtorch.cli import main

raise SystemExit(main())
